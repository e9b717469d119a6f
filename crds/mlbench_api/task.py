"""``BenchmarkTask``: what to train, with exactly which hyperparameters, to which goal.

A task is cluster-scoped and read-only in spirit: runs snapshot it when they start, so
editing a task never changes a run in flight. The official closed-division tasks ship as
YAML in ``manifests/catalog`` (see ``mlbench_api.catalog``).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from mlbench_api.common import API_VERSION, ApiModel, FreeForm, ObjectMeta, cel


class Division(StrEnum):
    """Closed: reference hyperparameters, only listed overrides. Open: anything goes."""

    CLOSED = "closed"
    OPEN = "open"


class ModelName(StrEnum):
    RESNET = "resnet"
    LOGISTIC_REGRESSION = "logistic-regression"


class ModelSpec(ApiModel):
    """The network. ResNet m1 = He et al. 2015, m2 = pre-activation (He et al. 2016)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.name != 'resnet' || (has(self.version) && has(self.depth))",
                    "a resnet model needs version and depth",
                    ".depth",
                )
            ]
        }
    )

    name: ModelName
    version: Literal["m1", "m2"] | None = None
    depth: Literal[20, 32, 44, 56] | None = None

    @model_validator(mode="after")
    def _rules(self) -> ModelSpec:
        if self.name is ModelName.RESNET and (self.version is None or self.depth is None):
            raise ValueError("depth: a resnet model needs version and depth")
        return self


class DatasetFormat(StrEnum):
    CIFAR_PYTHON = "cifar10-python"  #: the standard ``cifar-10-batches-py`` pickles
    IMAGE_FOLDER = "image-folder"  #: ``train|test/<class>/*.jpg``
    IMAGE_TARBALL = "image-tarball"  #: the same folder tree inside a .tar.gz
    LIBSVM = "libsvm"  #: ``label idx:value ...`` text (epsilon's distribution format)
    NPZ = "npz"  #: dense ``x_train, y_train, x_test, y_test`` arrays
    SYNTHETIC = "synthetic"  #: generated in process, for tests and smoke runs


class SyntheticData(ApiModel):
    """Shape of a generated stand-in dataset (e.g. epsilon's 2000 dense features)."""

    train_samples: Annotated[int, Field(ge=1, le=10_000_000)]
    test_samples: Annotated[int, Field(ge=1, le=10_000_000)]
    features: Annotated[int, Field(ge=1, le=100_000)] = 2000
    seed: Annotated[int, Field(ge=0)] = 0


#: Where a sourced dataset lives: the namespace's dataset volume is mounted here (see docs/datasets.md).
DATA_ROOT = "/data"
_SHA256 = r"^[0-9a-f]{64}$"
_URL = r"^https?://[^\s/?#]+[^\s]*$"
#: ``/data/<one or more segments>``: the fetcher writes only inside the dataset volume.
_UNDER_DATA = r"^/data(/[^/]+)+$"
_DOT_SEGMENT = r"(^|/)[.][.]?(/|$)"  # no backslashes: the same text is a CEL string literal


class DatasetSource(ApiModel):
    """Where the operator downloads a dataset from, and the bytes it must be.

    Content-addressed: the sha256 (not the URL) identifies the data, so a mirror with the same
    bytes is the same dataset, N runs fetch it once per namespace, and a corrupted or swapped
    download can never be trained on.
    """

    url: Annotated[str, Field(min_length=8, max_length=2048, pattern=_URL)] = Field(
        description="http or https URL of the file (a .tar/.tar.gz archive when unpack is true)."
    )
    sha256: Annotated[str, Field(pattern=_SHA256)] = Field(
        description="SHA-256 of the downloaded file, 64 lowercase hex digits."
    )
    unpack: bool = Field(
        default=False, description="Extract the .tar/.tar.gz archive into dataset.path instead of storing the file."
    )
    strip_components: Annotated[int, Field(ge=0, le=8)] = Field(
        default=0, description="With unpack: drop this many leading path components of every member (tar's option)."
    )


class DatasetSpec(ApiModel):
    """Where the data lives in the cluster, or how to generate it."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.format == 'synthetic' ? has(self.synthetic) : has(self.path)",
                    "a synthetic dataset needs 'synthetic', any other format needs 'path'",
                    ".format",
                ),
                cel(
                    "!(has(self.source) && has(self.volume))",
                    "source and volume are mutually exclusive: "
                    "a sourced dataset lives in the namespace's dataset volume",
                    ".source",
                ),
                cel(
                    f"!has(self.source) || (has(self.path) && self.path.matches('{_UNDER_DATA}') "
                    f"&& !self.path.matches('{_DOT_SEGMENT}'))",
                    "with a source, path must lie under /data/ (no '.' or '..' segments)",
                    ".path",
                ),
            ]
        }
    )

    name: Annotated[str, Field(min_length=1, max_length=63)]
    format: DatasetFormat
    path: Annotated[str, Field(max_length=4096)] | None = None
    volume: FreeForm | None = Field(
        default=None, description="A core/v1 VolumeSource mounted at /data on every worker."
    )
    source: DatasetSource | None = Field(
        default=None,
        description="Download into the namespace's dataset volume before the workers start (exclusive with volume).",
    )
    train_subset: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Use only the first N training samples (open division / smoke runs)."
    )
    test_subset: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Evaluate on the first N test samples only (open division / smoke runs)."
    )
    synthetic: SyntheticData | None = None

    @model_validator(mode="after")
    def _rules(self) -> DatasetSpec:
        if self.format is DatasetFormat.SYNTHETIC and self.synthetic is None:
            raise ValueError("synthetic: a synthetic dataset needs 'synthetic'")
        if self.format is not DatasetFormat.SYNTHETIC and self.path is None:
            raise ValueError("path: this dataset format needs 'path'")
        if self.source is not None and self.volume is not None:
            raise ValueError(
                "source: source and volume are mutually exclusive: a sourced dataset lives in the "
                "namespace's dataset volume"
            )
        if self.source is not None and not path_under_data_root(self.path):
            raise ValueError(f"path: with a source, path must lie under {DATA_ROOT}/ (no '.' or '..' segments)")
        return self


def path_under_data_root(path: str | None) -> bool:
    """True for ``/data/<something>`` without ``.``/``..`` segments: the fetcher writes only inside the volume."""
    return path is not None and bool(re.match(_UNDER_DATA, path)) and not re.search(_DOT_SEGMENT, path)


class Schedule(StrEnum):
    MULTI_STEP = "multistep"  #: per-sample rate, linear-scaling warm-up, step decays
    INVERSE_SQRT = "inverse-sqrt"  #: alpha / sqrt(t), alpha chosen by worker count
    CONSTANT = "constant"


class AlphaForWorkers(ApiModel):
    """Row of the 2a alpha table: applies from ``minWorkers`` workers up."""

    min_workers: Annotated[int, Field(ge=1, le=1024)]
    alpha: Annotated[float, Field(gt=0)]


class LearningRate(ApiModel):
    """The learning-rate rule. Rates are per sample so they scale with the batch."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.schedule != 'multistep' || has(self.perSample)",
                    "the multistep schedule needs perSample",
                    ".perSample",
                ),
                cel(
                    "self.schedule != 'inverse-sqrt' || (has(self.alphaByWorkers) && size(self.alphaByWorkers) > 0)",
                    "the inverse-sqrt schedule needs alphaByWorkers",
                    ".alphaByWorkers",
                ),
                cel(
                    "self.schedule != 'constant' || has(self.value)",
                    "the constant schedule needs value",
                    ".value",
                ),
                cel(
                    "!has(self.milestones) || (self.milestones.isSorted() && "
                    "self.milestones.all(m, self.milestones.filter(n, n == m).size() == 1))",
                    "milestones must be strictly increasing",
                    ".milestones",
                ),
            ]
        }
    )

    schedule: Schedule
    per_sample: Annotated[float, Field(gt=0, le=10)] | None = Field(
        default=None, description="eta: the rate per sample; one worker uses eta * batch."
    )
    value: Annotated[float, Field(gt=0)] | None = Field(default=None, description="The constant schedule's rate.")
    linear_scaling: bool = Field(
        default=True, description="Scale eta*b up to eta*b*k (k = world size) over the warm-up epochs."
    )
    warmup_epochs: Annotated[int, Field(ge=0, le=1000)] = 0
    milestones: Annotated[list[Annotated[int, Field(ge=1, le=100_000)]], Field(max_length=16)] = Field(
        default_factory=list
    )
    decay_factor: Annotated[float, Field(gt=0, le=1)] = 0.1
    alpha_by_workers: Annotated[list[AlphaForWorkers], Field(max_length=32)] = Field(default_factory=list)
    decay_unit: Literal["step", "epoch"] = Field(
        default="step", description="What t counts in alpha/sqrt(t): optimizer steps (from 1) or epochs."
    )

    @model_validator(mode="after")
    def _rules(self) -> LearningRate:
        # Mirrors the CEL rules so a local run fails as early and as clearly as kubectl apply.
        if self.schedule is Schedule.MULTI_STEP and self.per_sample is None:
            raise ValueError("perSample: the multistep schedule needs perSample")
        if self.schedule is Schedule.INVERSE_SQRT and not self.alpha_by_workers:
            raise ValueError("alphaByWorkers: the inverse-sqrt schedule needs alphaByWorkers")
        if self.schedule is Schedule.CONSTANT and self.value is None:
            raise ValueError("value: the constant schedule needs value")
        if self.milestones != sorted(set(self.milestones)):
            raise ValueError("milestones: milestones must be strictly increasing")
        return self


class Optimizer(StrEnum):
    SGD = "sgd"
    ADAM = "adam"


class Training(ApiModel):
    """The optimisation recipe, per worker."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.learningRate.warmupEpochs) || self.learningRate.warmupEpochs < self.maxEpochs",
                    "learningRate.warmupEpochs must be less than maxEpochs",
                    ".learningRate.warmupEpochs",
                ),
                cel(
                    "!has(self.learningRate.milestones) || self.learningRate.milestones.all(m, m < self.maxEpochs)",
                    "learningRate.milestones must be less than maxEpochs",
                    ".learningRate.milestones",
                ),
                cel(
                    "!self.nesterov || self.momentum > 0.0",
                    "nesterov needs momentum > 0",
                    ".nesterov",
                ),
            ]
        }
    )

    optimizer: Optimizer = Optimizer.SGD
    batch_size_per_worker: Annotated[int, Field(ge=1, le=65536)]
    learning_rate: LearningRate
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
    nesterov: bool = False
    weight_decay: Annotated[float, Field(ge=0, le=1)] = 0.0
    l2_regularization: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.0, description="lambda/2 * ||w||^2 added to the loss (2a); distinct from weightDecay."
    )
    max_epochs: Annotated[int, Field(ge=1, le=100_000)]

    @model_validator(mode="after")
    def _rules(self) -> Training:
        lr = self.learning_rate
        if lr.warmup_epochs >= self.max_epochs:
            raise ValueError("learningRate.warmupEpochs: must be less than maxEpochs")
        if any(m >= self.max_epochs for m in lr.milestones):
            raise ValueError("learningRate.milestones: must be less than maxEpochs")
        if self.nesterov and self.momentum <= 0:
            raise ValueError("nesterov: needs momentum > 0")
        return self


class GoalMode(StrEnum):
    TIME_TO_ACCURACY = "time-to-accuracy"  #: stop at the target; report the time
    ACCURACY_AFTER_TIME = "accuracy-after-time"  #: train for the budget; report accuracy


class Goal(ApiModel):
    """What counts as done. Accuracies are fractions (0.8 = 80 %)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.mode != 'accuracy-after-time' || has(self.timeBudgetSeconds)",
                    "accuracy-after-time needs timeBudgetSeconds",
                    ".timeBudgetSeconds",
                ),
                cel(
                    "!has(self.lightTarget) || self.lightTarget <= self.target",
                    "lightTarget must not exceed target",
                    ".lightTarget",
                ),
            ]
        }
    )

    metric: Literal["test-top1-accuracy", "test-accuracy"] = "test-top1-accuracy"
    comparator: Literal[">="] = ">="
    target: Annotated[float, Field(gt=0, le=1)]
    light_target: Annotated[float, Field(gt=0, le=1)] | None = None
    mode: GoalMode = GoalMode.TIME_TO_ACCURACY
    time_budget_seconds: Annotated[int, Field(ge=1, le=30 * 24 * 3600)] | None = None

    @model_validator(mode="after")
    def _rules(self) -> Goal:
        if self.mode is GoalMode.ACCURACY_AFTER_TIME and self.time_budget_seconds is None:
            raise ValueError("timeBudgetSeconds: accuracy-after-time needs timeBudgetSeconds")
        if self.light_target is not None and self.light_target > self.target:
            raise ValueError("lightTarget: must not exceed target")
        return self


class RunnerSpec(ApiModel):
    """The container that implements the task on every rank."""

    image: Annotated[str, Field(min_length=1, max_length=512)]
    command: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = Field(
        default_factory=lambda: ["mlbench-runner", "train"]
    )


class Overridable(StrEnum):
    """Names of the hyperparameters a run may override (``BenchmarkRun.spec.overrides``)."""

    OPTIMIZER = "optimizer"
    BATCH_SIZE_PER_WORKER = "batchSizePerWorker"
    LEARNING_RATE = "learningRate"
    MOMENTUM = "momentum"
    NESTEROV = "nesterov"
    WEIGHT_DECAY = "weightDecay"
    L2_REGULARIZATION = "l2Regularization"
    MAX_EPOCHS = "maxEpochs"
    MODEL = "model"
    TRAIN_SUBSET = "trainSubset"
    DATASET = "dataset"
    DATASET_SOURCE = "datasetSource"
    TIME_BUDGET_SECONDS = "timeBudgetSeconds"


class BenchmarkTaskSpec(ApiModel):
    """A benchmark task: the unit of comparison."""

    division: Division
    description: Annotated[str, Field(max_length=8192)] = ""
    model: ModelSpec
    dataset: DatasetSpec
    training: Training
    goal: Goal
    runner: RunnerSpec
    overridable: Annotated[list[Overridable], Field(max_length=16)] = Field(
        default_factory=list,
        description="Hyperparameters a closed-division run may override; open-division runs may override any.",
    )


class BenchmarkTask(ApiModel):
    """``mlbench.io/v1alpha1 BenchmarkTask`` (cluster-scoped, short name ``bt``)."""

    api_version: Literal["mlbench.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["BenchmarkTask"] = "BenchmarkTask"
    metadata: ObjectMeta
    spec: BenchmarkTaskSpec
