"""``BenchmarkTask``: what to train, with exactly which hyperparameters, to which goal.

A task is cluster-scoped and read-only in spirit: runs snapshot it when they start, so
editing a task never changes a run in flight. The official closed-division tasks ship as
YAML in ``manifests/catalog`` (see ``mlbench_api.catalog``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, WithJsonSchema, model_validator

from mlbench_api.common import (
    API_VERSION,
    DNS1123_SUBDOMAIN,
    MAX_LABEL_VALUE,
    MAX_SAFE_INT,
    ApiModel,
    ObjectMeta,
    cel,
    re2_search,
)
from mlbench_api.contract import DATA_DIR
from mlbench_api.datasets import reserved_path


class Division(StrEnum):
    """Closed: reference hyperparameters, only listed overrides. Open: anything goes."""

    CLOSED = "closed"
    OPEN = "open"


class ModelName(StrEnum):
    RESNET = "resnet"
    LOGISTIC_REGRESSION = "logistic-regression"
    TRANSFORMER = "transformer"
    GNMT = "gnmt"
    AWD_LSTM = "awd-lstm"


class TransformerSize(ApiModel):
    """A Transformer's sizes (fairseq's transformer_wmt_en_de by default: task 4b's base model)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [cel("self.dModel % self.heads == 0", "dModel must divide by heads", ".heads")]
        }
    )

    d_model: Annotated[int, Field(ge=2, le=16384)] = 512
    """Embedding and layer width (default 512)."""
    heads: Annotated[int, Field(ge=1, le=256)] = 8
    """Attention heads (default 8); must divide dModel."""
    ffn: Annotated[int, Field(ge=1, le=65536)] = 2048
    """Feed-forward inner width (default 2048)."""
    encoder_layers: Annotated[int, Field(ge=1, le=64)] = 6
    """Encoder layers (default 6)."""
    decoder_layers: Annotated[int, Field(ge=1, le=64)] = 6
    """Decoder layers (default 6)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1
    """Dropout after embeddings, attention and feed-forward blocks (default 0.1)."""
    norm_first: bool = False
    """Pre-norm layers (fairseq's --*-normalize-before); default false: post-norm, as the base model."""

    @model_validator(mode="after")
    def _rules(self) -> TransformerSize:
        if self.d_model % self.heads:
            raise ValueError("heads: dModel must divide by heads")
        return self


class GnmtSize(ApiModel):
    """GNMT's sizes (the reference's task 4a model by default: 4 + 4 layers, 1024 wide, dropout 0.2, shared
    embedding)."""

    hidden: Annotated[int, Field(ge=1, le=16384)] = 1024
    """Width of the embedding, every LSTM layer and the attention (default 1024)."""
    layers: Annotated[int, Field(ge=2, le=64)] = 4
    """LSTM layers in the encoder (the first bidirectional) and in the decoder (default 4)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Dropout before every LSTM layer (default 0.2)."""
    share_embedding: bool = True
    """One embedding for source and target over the joined vocabulary (default true, the reference's)."""


class AwdLstmSize(ApiModel):
    """An AWD-LSTM's sizes and dropouts (Merity et al. 2017; the reference's WikiText-2 model by default: task 3a)."""

    embedding: Annotated[int, Field(ge=1, le=65536)] = 400
    """Embedding width (default 400); with tied weights also the last LSTM layer's width."""
    hidden: Annotated[int, Field(ge=1, le=65536)] = 1150
    """Width of the LSTM layers but the last (default 1150)."""
    layers: Annotated[int, Field(ge=1, le=16)] = 3
    """Stacked one-layer LSTMs (default 3)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.4
    """Locked dropout on the last layer's output (default 0.4)."""
    dropout_hidden: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Locked dropout between LSTM layers (default 0.2, the reference's WikiText-2 setting)."""
    dropout_input: Annotated[float, Field(ge=0, lt=1)] = 0.65
    """Locked dropout on the embedded input (default 0.65)."""
    dropout_embedding: Annotated[float, Field(ge=0, lt=1)] = 0.1
    """Dropout of whole words of the embedding (default 0.1)."""
    weight_drop: Annotated[float, Field(ge=0, lt=1)] = 0.5
    """DropConnect on every layer's hidden-to-hidden weights (default 0.5)."""
    tie_weights: bool = True
    """Decoder weights tied to the embedding (default true)."""


class ModelSpec(ApiModel):
    """The network. ResNet m1 = He et al. 2015, m2 = pre-activation (He et al. 2016)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.name != 'resnet' || (has(self.version) && has(self.depth))",
                    "a resnet model needs version and depth",
                    ".depth",
                ),
                cel(
                    "self.name == 'transformer' || !has(self.transformer)",
                    "transformer sizes are for a transformer model only",
                    ".transformer",
                ),
                cel(
                    "self.name == 'gnmt' || !has(self.gnmt)",
                    "gnmt sizes are for a gnmt model only",
                    ".gnmt",
                ),
                cel(
                    "self.name == 'awd-lstm' || !has(self.awdLstm)",
                    "awdLstm sizes are for an awd-lstm model only",
                    ".awdLstm",
                ),
            ]
        }
    )

    name: ModelName
    """The architecture: resnet (CIFAR-style ResNet, task 1a), logistic-regression (task 2a), transformer (task 4b),
    gnmt (task 4a) or awd-lstm (task 3a)."""
    version: Literal["m1", "m2"] | None = None
    """ResNet variant: m1 = original (He et al. 2015), m2 = pre-activation (He et al. 2016). Required for resnet."""
    depth: Literal[20, 32, 44, 56] | None = None
    """ResNet depth in layers (20, 32, 44 or 56). Required for resnet; ignored by logistic-regression."""
    transformer: TransformerSize | None = None
    """transformer only: the sizes; unset: the base model (6+6 layers, 512 wide, 8 heads, FFN 2048)."""
    gnmt: GnmtSize | None = None
    """gnmt only: the sizes; unset: the reference's model (4 + 4 layers, 1024 wide, dropout 0.2)."""
    awd_lstm: AwdLstmSize | None = None
    """awd-lstm only: the sizes and dropouts; unset: the reference's WikiText-2 model (400/1150, 3 layers)."""

    @model_validator(mode="after")
    def _rules(self) -> ModelSpec:
        if self.name is ModelName.RESNET and (self.version is None or self.depth is None):
            raise ValueError("depth: a resnet model needs version and depth")
        if self.name is not ModelName.TRANSFORMER and self.transformer is not None:
            raise ValueError("transformer: transformer sizes are for a transformer model only")
        if self.name is not ModelName.GNMT and self.gnmt is not None:
            raise ValueError("gnmt: gnmt sizes are for a gnmt model only")
        if self.name is not ModelName.AWD_LSTM and self.awd_lstm is not None:
            raise ValueError("awdLstm: awdLstm sizes are for an awd-lstm model only")
        return self


class DatasetFormat(StrEnum):
    CIFAR_PYTHON = "cifar10-python"  #: the standard ``cifar-10-batches-py`` pickles
    IMAGE_FOLDER = "image-folder"  #: ``train|test/<class>/*.jpg``
    IMAGE_TARBALL = "image-tarball"  #: the same folder tree inside a .tar.gz
    LIBSVM = "libsvm"  #: ``label idx:value ...`` text (epsilon's distribution format)
    NPZ = "npz"  #: dense ``x_train, y_train, x_test, y_test`` arrays
    PARALLEL_TEXT = "parallel-text"  #: a folder of ``train|test.<lang>`` sentence files and fairseq's ``dict.txt``
    WIKITEXT_TOKENS = "wikitext-tokens"  #: a folder of WikiText's ``wiki.train|valid|test.tokens``
    SYNTHETIC = "synthetic"  #: generated in process, for tests and smoke runs (a transformer: the synthetic pair)


class SyntheticData(ApiModel):
    """Shape of a generated stand-in dataset (e.g. epsilon's 2000 dense features)."""

    train_samples: Annotated[int, Field(ge=1, le=10_000_000)]
    """Number of generated training samples."""
    test_samples: Annotated[int, Field(ge=1, le=10_000_000)]
    """Number of generated test samples."""
    features: Annotated[int, Field(ge=1, le=100_000)] = 2000
    """Dense features per sample (default 2000, epsilon's dimension)."""
    seed: Annotated[int, Field(ge=0, le=MAX_SAFE_INT)] = 0
    """Seed of the generator: the same seed gives the same data on every rank and every run."""


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
    sha256: Annotated[str, Field(pattern=_SHA256, max_length=64)] = Field(
        description="SHA-256 of the downloaded file, 64 lowercase hex digits; other bytes fail the run "
        "ChecksumMismatch."
    )
    unpack: bool = Field(
        default=False, description="Extract the .tar/.tar.gz archive into dataset.path instead of storing the file."
    )
    strip_components: Annotated[int, Field(ge=0, le=8)] = Field(
        default=0, description="With unpack: drop this many leading path components of every member (tar's option)."
    )


#: A core/v1 VolumeSource, passed through (free-form) but for ``name``, declared only so that CEL can refuse it:
#: the operator names the workers' data volume itself.
VolumeSource = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {
                "name": {
                    "type": "string",
                    "description": "Not allowed: a VolumeSource has no name (the operator calls the volume data).",
                    "maxLength": 63,
                }
            },
        }
    ),
]


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
                    "!has(self.volume) || !has(self.volume.name)",
                    "volume.name must not be set: volume is a VolumeSource, the operator names the volume itself",
                    ".volume.name",
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
    """Short name of the dataset (e.g. cifar10); names the fetch Job mlbench-dataset-<name>-<key> of a sourced one."""
    format: DatasetFormat
    """How the files are laid out: cifar10-python, image-folder, image-tarball, libsvm, npz, or synthetic (generated, no
    files)."""
    path: Annotated[str, Field(max_length=4096)] | None = None
    """Where the workers read the data (a file or folder; the volume is mounted at /data). Required unless format is
    synthetic; with source, must lie under /data/."""
    volume: VolumeSource | None = Field(
        default=None,
        description="A core/v1 VolumeSource (e.g. nfs, persistentVolumeClaim) mounted read-only at /data on every "
        "worker; exclusive with source.",
    )
    source: DatasetSource | None = Field(
        default=None,
        description="Download into the namespace's dataset volume before the workers start (exclusive with volume).",
    )
    train_subset: Annotated[int, Field(ge=1, le=MAX_SAFE_INT)] | None = Field(
        default=None, description="Train on the first N training samples only (smoke runs; changes the benchmark)."
    )
    test_subset: Annotated[int, Field(ge=1, le=MAX_SAFE_INT)] | None = Field(
        default=None, description="Evaluate on the first N test samples only (smoke runs; changes the benchmark)."
    )
    synthetic: SyntheticData | None = None
    """Shape of the generated data; required when format is synthetic."""

    @model_validator(mode="after")
    def _rules(self) -> DatasetSpec:
        if self.format is DatasetFormat.SYNTHETIC and self.synthetic is None:
            raise ValueError("synthetic: a synthetic dataset needs 'synthetic'")
        if self.format is not DatasetFormat.SYNTHETIC and self.path is None:
            raise ValueError("path: this dataset format needs 'path'")
        if self.volume is not None and "name" in self.volume:
            # {"name": "data", **volume} would rename the pod's volume away from its mount (a 422 on every create)
            raise ValueError(
                "volume.name: must not be set: volume is a VolumeSource, the operator names the volume itself"
            )
        if self.source is not None and self.volume is not None:
            raise ValueError(
                "source: source and volume are mutually exclusive: a sourced dataset lives in the "
                "namespace's dataset volume"
            )
        if self.source is not None and not path_under_data_root(self.path):
            raise ValueError(f"path: with a source, path must lie under {DATA_DIR}/ (no '.' or '..' segments)")
        reserved = reserved_path(self.path or "") if self.source is not None else None
        if reserved:
            raise ValueError(f"path: {reserved}")
        return self


def path_under_data_root(path: str | None) -> bool:
    """True for ``/data/<something>`` without ``.``/``..`` segments: the fetcher writes only inside the volume."""
    return path is not None and re2_search(_UNDER_DATA, path) and not re2_search(_DOT_SEGMENT, path)


class Schedule(StrEnum):
    MULTI_STEP = "multistep"  #: per-sample rate, linear-scaling warm-up, step decays
    INVERSE_SQRT = "inverse-sqrt"  #: alpha / sqrt(t), alpha chosen by worker count
    CONSTANT = "constant"
    WARMUP_INVERSE_SQRT = "warmup-inverse-sqrt"  #: linear from 0 to value over warmupSteps, then value*sqrt(w/t)
    #: value * 0.01**((w - t) / w) up to warmupSteps, then halvings from decayStart of the total steps (task 4a)
    EXPONENTIAL_WARMUP_STEP_DECAY = "exponential-warmup-step-decay"


#: The schedules of the translation tasks (4b's, 4a's); the other models take neither.
TRANSLATION_SCHEDULES = (Schedule.WARMUP_INVERSE_SQRT, Schedule.EXPONENTIAL_WARMUP_STEP_DECAY)


class AlphaForWorkers(ApiModel):
    """Row of the 2a alpha table: applies from ``minWorkers`` workers up."""

    min_workers: Annotated[int, Field(ge=1, le=1024)]
    """Smallest world size (total processes) this row applies to."""
    alpha: Annotated[float, Field(gt=0)]
    """The alpha of alpha/sqrt(t) for that world size and up to the next row."""


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
                    "self.schedule != 'warmup-inverse-sqrt' || (has(self.value) && has(self.warmupSteps))",
                    "the warmup-inverse-sqrt schedule needs value and warmupSteps",
                    ".warmupSteps",
                ),
                cel(
                    "self.schedule != 'exponential-warmup-step-decay' || (has(self.value) && has(self.warmupSteps))",
                    "the exponential-warmup-step-decay schedule needs value and warmupSteps",
                    ".warmupSteps",
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
    """multistep (needs perSample), inverse-sqrt (needs alphaByWorkers), constant (needs value),
    warmup-inverse-sqrt (needs value and warmupSteps; task 4b's) or exponential-warmup-step-decay (needs value and
    warmupSteps; task 4a's, docs/tasks-translation.md)."""
    per_sample: Annotated[float, Field(gt=0, le=10)] | None = Field(
        default=None,
        description="multistep: eta, the learning rate per sample; a rank steps with eta * batchSizePerWorker "
        "(before linear scaling).",
    )
    value: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="constant: the learning rate of every step; warmup-inverse-sqrt and "
        "exponential-warmup-step-decay: the peak rate, reached at warmupSteps.",
    )
    warmup_steps: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        default=None,
        description="warmup-inverse-sqrt: optimizer steps of linear warm-up from 0 to value, after which the rate is "
        "value * sqrt(warmupSteps / step) (fairseq's inverse_sqrt); exponential-warmup-step-decay: steps of "
        "exponential warm-up from value / 100 to value.",
    )
    decay_start: Annotated[float, Field(ge=0, le=1)] = 0.4
    """exponential-warmup-step-decay: the fraction of all training steps after which the first decay applies
    (default 0.4)."""
    decay_interval: Annotated[float, Field(gt=0, le=1)] = 0.05
    """exponential-warmup-step-decay: the fraction of all training steps between decays (default 0.05)."""
    max_decays: Annotated[int, Field(ge=0, le=1000)] = 4
    """exponential-warmup-step-decay: the most decays (default 4)."""
    linear_scaling: bool = Field(
        default=True,
        description="multistep: scale eta*b up to eta*b*k (k = world size) over the warm-up epochs (default true).",
    )
    warmup_epochs: Annotated[int, Field(ge=0, le=1000)] = 0
    """multistep: epochs of linear warm-up from eta*b to the peak rate (default 0: start at the peak). Less than
    maxEpochs."""
    milestones: Annotated[list[Annotated[int, Field(ge=1, le=100_000)]], Field(max_length=16)] = Field(
        default_factory=list
    )
    """multistep: epochs after which the rate is multiplied by decayFactor; strictly increasing, each less than
    maxEpochs."""
    decay_factor: Annotated[float, Field(gt=0, le=1)] = 0.1
    """multistep: factor applied at every milestone (default 0.1); exponential-warmup-step-decay: at every decay
    (task 4a: 0.5)."""
    alpha_by_workers: Annotated[list[AlphaForWorkers], Field(max_length=32)] = Field(default_factory=list)
    """inverse-sqrt: alpha per world size; the row with the largest minWorkers not above the world size applies."""
    decay_unit: Literal["step", "epoch"] = Field(
        default="step",
        description="inverse-sqrt: what t counts in alpha/sqrt(t): step (default, optimizer steps from 1) or epoch.",
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
        if self.schedule in TRANSLATION_SCHEDULES and (self.value is None or self.warmup_steps is None):
            raise ValueError(f"warmupSteps: the {self.schedule.value} schedule needs value and warmupSteps")
        if self.milestones != sorted(set(self.milestones)):
            raise ValueError("milestones: milestones must be strictly increasing")
        return self


class Optimizer(StrEnum):
    SGD = "sgd"
    ADAM = "adam"


class Algorithm(StrEnum):
    """How the ranks agree on the model (``BenchmarkRun.spec.algorithm``; the runner's registry)."""

    ALLREDUCE_SGD = "allreduce-sgd"  #: the reference: flatten, all-reduce, average, step
    DDP = "ddp"  #: torch DistributedDataParallel, the comparison baseline
    CENTRALIZED_ADAM = "centralized-adam"  #: averaged gradients (all-reduce), then Adam on every rank
    POWERSGD = "powersgd"  #: rank-r PowerSGD compression with error feedback (Vogels et al. 2019)
    DECENTRALIZED_SGD = "decentralized-sgd"  #: local step, then gossip averaging with the topology's neighbours
    SIGN_SGD = "sign-sgd"  #: majority vote of the gradients' signs (all-reduce of int8 signs)
    SPARSIFIED_SGD = "sparsified-sgd"  #: top-k or random-k of the gradient with error-feedback memory


#: The algorithms that compute the reference's update (synchronous averaged-gradient SGD): what a closed task
#: allows unless it lists others in ``algorithms``.
REFERENCE_ALGORITHMS = (Algorithm.ALLREDUCE_SGD, Algorithm.DDP)


class LossScaling(ApiModel):
    """The dynamic loss scale of mixed-precision training (tasks 4a and 4b of the page): the loss is multiplied by the
    scale before backward and the gradient divided by it; a non-finite gradient skips the step and divides the scale
    by factor, ``window`` clean steps in a row multiply it by factor (up to maxScale)."""

    initial_scale: Annotated[float, Field(gt=0)] = 128.0
    """The first scale (default 2**7)."""
    factor: Annotated[float, Field(gt=1)] = 2.0
    """Down- and up-scaling factor (default 2)."""
    window: Annotated[int, Field(ge=1, le=10_000_000)] = 2000
    """Clean steps before the scale grows (default 2000)."""
    max_scale: Annotated[float, Field(gt=0)] | None = None
    """The largest scale (task 4a: 2**13); unset: no bound (task 4b)."""


class TranslationTraining(ApiModel):
    """What a translation task (model transformer or gnmt) adds to its training: batches by tokens or sentences,
    Adam's constants, label smoothing, loss scaling, gradient clipping, and the decoding its BLEU is measured with."""

    tokens_per_step: Annotated[int, Field(ge=1, le=1 << 30)] = 1 << 17
    """b: target tokens per optimizer step over all ranks (default 2**17). Each rank accumulates
    update_freq = max(1, b / (batchSizePerWorker * world size)) micro-batches of at most
    b / (world size * update_freq) tokens, and all-reduces once per optimizer step."""
    sentences_per_step: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    """Set: b counts sentence pairs instead of tokens (task 4a: 2048), batchSizePerWorker is bs_max in sentences,
    and the gradient is the mean per sentence; tokensPerStep is then unused."""
    adam_betas: Annotated[list[Annotated[float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)] = Field(
        default_factory=lambda: [0.9, 0.98]
    )
    """Adam's beta1 and beta2 (default 0.9, 0.98)."""
    adam_eps: Annotated[float, Field(gt=0, le=1)] = 1e-9
    """Adam's epsilon (default 1e-9)."""
    label_smoothing: Annotated[float, Field(ge=0, lt=1)] = 0.1
    """Label smoothing of the cross-entropy (default 0.1)."""
    precision: Literal["fp32", "fp16", "bf16"] = "fp16"
    """Mixed precision on a GPU: fp16 (default, with lossScaling), bf16, or fp32; a CPU trains in fp32."""
    loss_scaling: LossScaling = Field(default_factory=LossScaling)
    """The dynamic loss scale (also applied in fp32 and bf16, where it rarely matters)."""
    max_length: Annotated[int, Field(ge=2, le=4096)] = 80
    """Longest sentence in tokens (end of sentence included), in training and, unless testMaxLength, test; longer
    pairs are dropped."""
    test_max_length: Annotated[int, Field(ge=2, le=4096)] | None = None
    """Longest test sentence and hypothesis in tokens (task 4a: 150); unset: maxLength."""
    clip_norm: Annotated[float, Field(gt=0, le=1e6)] | None = None
    """The averaged gradient's global norm is clipped at this (task 4a: 5.0); unset: no clipping."""
    beam: Annotated[int, Field(ge=1, le=64)] = 4
    """Beam size of the decoding that BLEU is measured on (default 4)."""
    length_penalty: Annotated[float, Field(ge=0, le=10)] = 0.6
    """Hypothesis score = log-probability / length**lengthPenalty (default 0.6), or with lengthNormConst c GNMT's
    log-probability / ((c + length) / (c + 1))**lengthPenalty."""
    length_norm_const: Annotated[float, Field(ge=0, le=1000)] | None = None
    """GNMT's length normalisation constant c (task 4a: 5); unset: length**lengthPenalty (fairseq's)."""
    coverage_penalty: Annotated[float, Field(ge=0, le=10)] = 0.0
    """GNMT's coverage penalty weight (task 4a: 0.1): adds weight * sum over source tokens of log(min(1, attention
    received)); needs a model that reports its attention (gnmt). Default 0."""


class LanguageModelTraining(ApiModel):
    """What a language-modelling task (model awd-lstm) adds to its training: task 3a's BPTT windows, clipping,
    activation regularisation and the switch to averaged SGD. batchSizePerWorker counts streams, learningRate.value
    is eta for a window of bptt tokens, weightDecay is SGD's."""

    bptt: Annotated[int, Field(ge=2, le=10000)] = 70
    """Back-propagation-through-time window (default 70); also the evaluation's window."""
    random_length: bool = True
    """Draw each training window's length: X ~ Bernoulli(shortProbability), max(minLength, Normal(bptt / (1 + X),
    lengthStd)) (default true); false: every window is bptt."""
    short_probability: Annotated[float, Field(ge=0, le=1)] = 0.05
    """P(X = 1), a half-length window (default 0.05)."""
    length_std: Annotated[float, Field(ge=0, le=1000)] = 5.0
    """Standard deviation of the window length (default 5)."""
    min_length: Annotated[int, Field(ge=1, le=10000)] = 5
    """Shortest drawn window (default 5)."""
    warmup_epochs_per_worker: Annotated[float, Field(ge=0, le=1000)] = 3.0
    """The rate rises linearly from eta to eta * sqrt(world size) over world size * this many epochs (default 3)."""
    clip_norm: Annotated[float, Field(gt=0, le=1e6)] = 0.25
    """The averaged gradient's norm is clipped at this (default 0.25)."""
    ar_alpha: Annotated[float, Field(ge=0, le=1e3)] = 2.0
    """Activation regularisation: alpha * mean(h^2) of the last layer's dropped output (default 2)."""
    tar_beta: Annotated[float, Field(ge=0, le=1e3)] = 1.0
    """Temporal activation regularisation: beta * mean((h_t - h_t-1)^2) of its raw output (default 1)."""
    nonmono: Annotated[int, Field(ge=1, le=10000)] = 5
    """Averaged SGD starts when the validation loss has not improved for this many epochs (default 5)."""
    eval_batch_size: Annotated[int, Field(ge=1, le=65536)] = 10
    """Streams the evaluated split is cut into, over all ranks (default 10)."""
    evaluate_on: Literal["valid", "test"] = "valid"
    """The split the goal is measured on after every epoch (default valid, the page's); the test split's perplexity of
    the final model is reported either way."""


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
    """sgd (default) or adam."""
    batch_size_per_worker: Annotated[int, Field(ge=1, le=65536)]
    """Samples per optimizer step on each process (rank); the global batch is this times the world size. A
    transformer: the most target tokens in one micro-batch (bs_max; translation.tokensPerStep is the batch)."""
    learning_rate: LearningRate
    """The learning-rate schedule."""
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """SGD momentum, 0 (default, none) up to but excluding 1."""
    nesterov: bool = False
    """Use Nesterov momentum (sgd; needs momentum > 0)."""
    weight_decay: Annotated[float, Field(ge=0, le=1)] = 0.0
    """The optimizer's weight_decay (torch's: decay*w added to the gradient), default 0."""
    l2_regularization: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.0, description="lambda/2 * ||w||^2 added to the loss (2a); distinct from weightDecay."
    )
    max_epochs: Annotated[int, Field(ge=1, le=100_000)]
    """Training stops after this many epochs (passes over the training data) if the goal was not met earlier."""
    translation: TranslationTraining | None = None
    """A transformer's (required there, refused elsewhere): token batches, Adam's constants, label smoothing,
    loss scaling and decoding."""
    language_model: LanguageModelTraining | None = None
    """An awd-lstm's (required there, refused elsewhere): BPTT windows, clipping, AR/TAR, the averaged-SGD switch."""

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


class GoalMetric(StrEnum):
    """What the goal measures after every epoch, on the whole test split."""

    TEST_TOP1_ACCURACY = "test-top1-accuracy"  #: fraction of correct predictions (multi-class)
    TEST_ACCURACY = "test-accuracy"  #: fraction of correct predictions (binary, task 2a)
    BLEU = "bleu"  #: corpus BLEU (0..100) of the decoded test set against its references (sacrebleu)
    PERPLEXITY = "perplexity"  #: exp of the mean per-token test loss; lower is better
    LOSS = "loss"  #: the mean test loss; lower is better


#: The metrics that are a fraction of correct predictions (shown as a percentage).
ACCURACY_METRICS = frozenset({GoalMetric.TEST_TOP1_ACCURACY, GoalMetric.TEST_ACCURACY})
#: The metrics whose goal is met at or below the target; all others at or above it.
LOWER_IS_BETTER = frozenset({GoalMetric.PERPLEXITY, GoalMetric.LOSS})
#: The largest target each bounded metric can reach.
METRIC_MAXIMUM = {GoalMetric.TEST_TOP1_ACCURACY: 1.0, GoalMetric.TEST_ACCURACY: 1.0, GoalMetric.BLEU: 100.0}


def known_metric(value: object) -> GoalMetric | None:
    """``value`` as a goal metric; None when it names none this API knows (absent, or from a newer version)."""
    return next((m for m in GoalMetric if m.value == value), None)


def comparator_of(metric: GoalMetric) -> Literal[">=", "<="]:
    """``<=`` for the metrics where lower is better (perplexity, loss), ``>=`` for the others."""
    return "<=" if metric in LOWER_IS_BETTER else ">="


def goal_met(metric: GoalMetric, value: float, target: float) -> bool:
    """Whether ``value`` of ``metric`` meets ``target`` (a NaN never does)."""
    return value <= target if metric in LOWER_IS_BETTER else value >= target


def better(metric: GoalMetric, values: list[float]) -> float:
    """The best of ``values`` for ``metric`` (the lowest where lower is better)."""
    return min(values) if metric in LOWER_IS_BETTER else max(values)


class Goal(ApiModel):
    """What counts as done: a metric of the test split compared with a target after every epoch."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.mode != 'accuracy-after-time' || has(self.timeBudgetSeconds)",
                    "accuracy-after-time needs timeBudgetSeconds",
                    ".timeBudgetSeconds",
                ),
                cel(
                    "!has(self.lightTarget) || (self.metric in ['perplexity', 'loss'] ? "
                    "self.lightTarget >= self.target : self.lightTarget <= self.target)",
                    "lightTarget must not be harder to reach than target",
                    ".lightTarget",
                ),
                cel(
                    "!has(self.comparator) || self.comparator == (self.metric in ['perplexity', 'loss'] ? '<=' : '>=')",
                    "comparator must be the metric's: <= for perplexity and loss, >= for the others",
                    ".comparator",
                ),
                cel(
                    "!(self.metric in ['test-top1-accuracy', 'test-accuracy']) || self.target <= 1.0",
                    "an accuracy target is a fraction in (0, 1]",
                    ".target",
                ),
                cel("self.metric != 'bleu' || self.target <= 100.0", "a BLEU target is at most 100", ".target"),
            ]
        }
    )

    metric: GoalMetric = GoalMetric.TEST_TOP1_ACCURACY
    """Evaluated on the whole test split after every epoch: test-top1-accuracy (default; multi-class) or
    test-accuracy (binary, task 2a) as fractions; bleu (0..100, sacrebleu on the detokenized test set); perplexity
    or loss (mean test loss; lower is better for both)."""
    comparator: Literal[">=", "<="] | None = None
    """How the metric is compared with the target; it follows from the metric (>= for accuracies and BLEU, <= for
    perplexity and loss). Unset: the metric's; set: must be the metric's."""
    target: Annotated[float, Field(gt=0)]
    """The value to reach, in the metric's units: accuracies as fractions in (0, 1] (0.8 = 80 %), BLEU in (0, 100];
    used by runs with goal full."""
    light_target: Annotated[float, Field(gt=0)] | None = None
    """A target for quick runs, not harder to reach than target (lower for accuracies and BLEU, higher for
    perplexity and loss); used by runs with goal light. Unset: light runs use target."""
    mode: GoalMode = GoalMode.TIME_TO_ACCURACY
    """time-to-accuracy (default): stop at the target and report the time; accuracy-after-time: train for
    timeBudgetSeconds and report the metric (whichever the goal's metric is)."""
    time_budget_seconds: Annotated[int, Field(ge=1, le=30 * 24 * 3600)] | None = None
    """accuracy-after-time (required there): seconds of training (at most 30 days); when spent, training stops after one
    last evaluation."""

    @model_validator(mode="after")
    def _rules(self) -> Goal:
        if self.mode is GoalMode.ACCURACY_AFTER_TIME and self.time_budget_seconds is None:
            raise ValueError("timeBudgetSeconds: accuracy-after-time needs timeBudgetSeconds")
        if self.comparator is not None and self.comparator != comparator_of(self.metric):
            raise ValueError(f"comparator: {self.metric.value} is met at {comparator_of(self.metric)} its target")
        maximum = METRIC_MAXIMUM.get(self.metric)
        for name, value in (("target", self.target), ("lightTarget", self.light_target)):
            if maximum is not None and value is not None and value > maximum:
                raise ValueError(f"{name}: a {self.metric.value} target is at most {maximum:g}")
        if self.light_target is not None and not goal_met(self.metric, self.target, self.light_target):
            raise ValueError("lightTarget: must not be harder to reach than target")
        return self

    def met(self, value: float, target: float | None = None) -> bool:
        """Whether ``value`` of the goal's metric meets ``target`` (default: the full target)."""
        return goal_met(self.metric, value, self.target if target is None else target)


class CollectiveOp(StrEnum):
    """A collective timed by a collectives task (the names of nccl-tests' all_reduce_perf etc.)."""

    ALL_REDUCE = "all-reduce"  #: sum all-reduce of a float32 buffer of S bytes
    ALL_GATHER = "all-gather"  #: every rank contributes S/n bytes; S bytes (the gathered total) land on every rank
    BROADCAST = "broadcast"  #: rank 0's S bytes to every rank


#: Largest message of a collectives sweep (1 GiB): every rank holds two buffers of this size.
MAX_COLLECTIVE_BYTES = 1 << 30
#: Bytes of one element of the sweep's dtype (float32).
COLLECTIVE_ELEMENT_BYTES = 4


class CollectiveBenchmark(ApiModel):
    """Task 0a: time the backend's collectives over message sizes minBytes, minBytes*factor, ... up to maxBytes.

    For each operation and size: warmupIterations untimed, then iterations back to back (the mean time gives
    nccl-tests' algbw = S/t and busbw), then iterations each after a barrier (the latency percentiles).
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.minBytes) || !has(self.maxBytes) || self.minBytes <= self.maxBytes",
                    "minBytes must not exceed maxBytes",
                    ".minBytes",
                ),
                cel(
                    "!has(self.operations) || self.operations.all(o, self.operations.filter(p, p == o).size() == 1)",
                    "operations must not repeat",
                    ".operations",
                ),
            ]
        }
    )

    operations: Annotated[list[CollectiveOp], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: list(CollectiveOp)
    )
    """Collectives to time, in this order: all-reduce, all-gather, broadcast (default all three, no repeats)."""
    min_bytes: Annotated[
        int, Field(ge=COLLECTIVE_ELEMENT_BYTES, le=MAX_COLLECTIVE_BYTES, multiple_of=COLLECTIVE_ELEMENT_BYTES)
    ] = 4
    """Smallest message in bytes (default 4, one float32); a multiple of 4."""
    max_bytes: Annotated[
        int, Field(ge=COLLECTIVE_ELEMENT_BYTES, le=MAX_COLLECTIVE_BYTES, multiple_of=COLLECTIVE_ELEMENT_BYTES)
    ] = 256 * 1024 * 1024
    """Largest message in bytes (default 268435456 = 256 MiB, at most 1 GiB); a multiple of 4, always timed."""
    factor: Annotated[int, Field(ge=2, le=1024)] = 2
    """Each size is the previous one times factor (nccl-tests' -f, default 2); maxBytes ends the ladder."""
    iterations: Annotated[int, Field(ge=1, le=10_000)] = 20
    """Timed iterations per size and phase (nccl-tests' -n, default 20); fewer where maxSecondsPerSize says so."""
    warmup_iterations: Annotated[int, Field(ge=1, le=1000)] = 5
    """Untimed iterations before each size (nccl-tests' -w, default 5); they also estimate the time per iteration."""
    max_seconds_per_size: Annotated[float, Field(gt=0, le=3600)] = 10.0
    """Time budget of one size's two timed phases in seconds (default 10, at most 3600): from the warm-up's time per
    iteration, iterations is lowered (to 1 at least) so that both phases fit, which bounds huge messages on slow
    networks. A fast network never hits it."""
    dtype: Literal["float32"] = "float32"
    """Element type of the buffers (float32 only; all-reduce sums)."""

    @model_validator(mode="after")
    def _rules(self) -> CollectiveBenchmark:
        if self.min_bytes > self.max_bytes:
            raise ValueError("minBytes: must not exceed maxBytes")
        if len(set(self.operations)) != len(self.operations):
            raise ValueError("operations: must not repeat")
        return self

    def sizes(self) -> list[int]:
        """The message sizes in bytes: minBytes * factor^k below maxBytes, then maxBytes (increasing, no repeats)."""
        return size_ladder(self.min_bytes, self.max_bytes, self.factor)


def size_ladder(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """``min_bytes, min_bytes*factor, ...`` while below ``max_bytes``, then ``max_bytes`` itself."""
    if not 0 < min_bytes <= max_bytes or factor < 2:
        raise ValueError(f"size ladder: need 0 < min ({min_bytes}) <= max ({max_bytes}) and factor ({factor}) >= 2")
    sizes = []
    size = min_bytes
    while size < max_bytes:
        sizes.append(size)
        size *= factor
    return [*sizes, max_bytes]


#: The reference runner's console script: ``runner.command`` starting with it is MLBench's own program.
RUNNER_ENTRYPOINT = "mlbench-runner"


class RunnerSpec(ApiModel):
    """The container that implements the task on every rank."""

    image: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    """Container image of every pod of a run (workers, launcher, dataset fetch) unless the run sets spec.image.
    Unset: the operator's runner image (its MLBENCH_RUNNER_IMAGE setting), copied into the run's
    status.taskSnapshot at admission, so that the catalog names no registry."""
    command: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = Field(
        default_factory=lambda: [RUNNER_ENTRYPOINT, "train"]
    )
    """What every rank runs under mpirun (default mlbench-runner train). mlbench-runner subcommands get --config;
    another program (an open-division image's) reads $MLBENCH_RUN_CONFIG, writes summary.json (docs/runner.md)."""

    @property
    def serves_metrics(self) -> bool:
        """Whether every rank serves Prometheus metrics (on 9400 + local rank): the reference runner does, however
        it is started (``mlbench-runner``, a path to it, ``python -m mlbench_runner...``); another program is not
        asked to (docs/runner.md), so no metrics port is declared for it, or each of its ranks would look down to
        Prometheus all run long."""
        return is_reference_runner(self.command)


def is_reference_runner(command: list[str]) -> bool:
    """Whether ``command`` starts MLBench's own runner: its console script (by any path) or its module."""
    if not command:
        return False
    if PurePosixPath(command[0]).name == RUNNER_ENTRYPOINT:
        return True
    return len(command) > 2 and command[1] == "-m" and command[2].split(".")[0] == "mlbench_runner"


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


#: The translation models (tasks 4b and 4a), what they read, and the goals they can measure; the other models take
#: neither parallel text nor bleu / perplexity goals.
TRANSLATION_MODELS = ("transformer", "gnmt")
TRANSLATION_FORMATS = ("parallel-text", "synthetic")
TRANSLATION_METRICS = ("bleu", "perplexity", "loss")
#: What an awd-lstm (language-modelling) task reads and measures; the other models take neither WikiText's token
#: files nor a languageModel section.
LANGUAGE_MODEL_FORMATS = ("wikitext-tokens", "synthetic")
LANGUAGE_MODEL_METRICS = ("perplexity", "loss")


def translation_errors(model: ModelSpec, dataset: DatasetSpec, training: Training, goal: Goal) -> list[str]:
    """What a translation task (transformer, gnmt) breaks of its kind's rules (mirrors the CEL rules)."""
    errors = []
    if (
        training.translation is None
        or training.optimizer is not Optimizer.ADAM
        or training.learning_rate.schedule not in TRANSLATION_SCHEDULES
    ):
        errors.append(
            "training: a translation task (transformer, gnmt) needs training.translation, optimizer adam and the "
            "warmup-inverse-sqrt or exponential-warmup-step-decay schedule"
        )
    if dataset.format.value not in TRANSLATION_FORMATS:
        errors.append("dataset: a translation task reads parallel-text or generates the synthetic pair")
    if goal.metric.value not in TRANSLATION_METRICS:
        errors.append("goal: a translation task's goal is bleu, perplexity or loss")
    x = training.translation
    if x is not None and x.coverage_penalty > 0 and model.name is not ModelName.GNMT:
        errors.append("training: translation.coveragePenalty needs a model that reports its attention (gnmt)")
    return errors


def task_kind_errors(model: ModelSpec, dataset: DatasetSpec, training: Training, goal: Goal) -> list[str]:
    """What a task's sections break of the translation and language-modelling kinds' rules (mirrors the CEL
    rules), as field: message."""
    if model.name.value in TRANSLATION_MODELS:
        return translation_errors(model, dataset, training, goal) + language_model_errors(
            model, dataset, training, goal
        )
    errors = []
    if training.translation is not None or training.learning_rate.schedule in TRANSLATION_SCHEDULES:
        errors.append("training: training.translation and the translation schedules are a translation task's")
    if dataset.format is DatasetFormat.PARALLEL_TEXT:
        errors.append("dataset: the parallel-text format is a translation task's")
    if goal.metric is GoalMetric.BLEU or (
        goal.metric is GoalMetric.PERPLEXITY and model.name is not ModelName.AWD_LSTM
    ):
        errors.append("goal: bleu goals are a translation task's, perplexity goals a translation or awd-lstm task's")
    return errors + language_model_errors(model, dataset, training, goal)


def language_model_errors(model: ModelSpec, dataset: DatasetSpec, training: Training, goal: Goal) -> list[str]:
    """What a task's sections break of the language-modelling kind's rules (mirrors the CEL rules)."""
    if model.name is not ModelName.AWD_LSTM:
        wrong = training.language_model is not None or dataset.format is DatasetFormat.WIKITEXT_TOKENS
        return (
            ["training: training.languageModel and the wikitext-tokens format are an awd-lstm task's"] if wrong else []
        )
    errors = []
    if training.language_model is None or training.optimizer is not Optimizer.SGD:
        errors.append("training: an awd-lstm task needs training.languageModel and optimizer sgd")
    if training.learning_rate.schedule is not Schedule.CONSTANT:
        errors.append("training: an awd-lstm task's learningRate is constant (eta per bptt window)")
    if dataset.format.value not in LANGUAGE_MODEL_FORMATS:
        errors.append("dataset: an awd-lstm task reads wikitext-tokens or generates the synthetic corpus")
    if goal.metric.value not in LANGUAGE_MODEL_METRICS:
        errors.append("goal: an awd-lstm task's goal is perplexity or loss")
    return errors


def _language_model_rules(awd: str) -> list[Any]:
    """The CEL mirror of :func:`language_model_errors`."""
    return [
        cel(
            f"!({awd}) || (has(self.training) && has(self.training.languageModel) && self.training.optimizer == 'sgd')",
            "an awd-lstm task needs training.languageModel and optimizer sgd",
            ".training",
        ),
        cel(
            f"!({awd}) || !has(self.training) || self.training.learningRate.schedule == 'constant'",
            "an awd-lstm task's learningRate is constant (eta per bptt window)",
            ".training",
        ),
        cel(
            f"!({awd}) || (has(self.dataset) && self.dataset.format in {list(LANGUAGE_MODEL_FORMATS)})",
            "an awd-lstm task reads wikitext-tokens or generates the synthetic corpus (format synthetic)",
            ".dataset",
        ),
        cel(
            f"!({awd}) || (has(self.goal) && self.goal.metric in {list(LANGUAGE_MODEL_METRICS)})",
            "an awd-lstm task's goal is perplexity or loss",
            ".goal",
        ),
        cel(
            f"{awd} || ((!has(self.training) || !has(self.training.languageModel)) && "
            "(!has(self.dataset) || self.dataset.format != 'wikitext-tokens'))",
            "training.languageModel and the wikitext-tokens format are an awd-lstm task's",
            ".training",
        ),
    ]


def _translation_rules(translation: str, awd: str) -> list[Any]:
    """The CEL mirror of :func:`translation_errors` and of the other kinds' half of :func:`task_kind_errors`."""
    schedules = [s.value for s in TRANSLATION_SCHEDULES]
    return [
        cel(
            f"!({translation}) || (has(self.training) && has(self.training.translation) && "
            f"self.training.optimizer == 'adam' && self.training.learningRate.schedule in {schedules})",
            "a translation task (transformer, gnmt) needs training.translation, optimizer adam and the "
            "warmup-inverse-sqrt or exponential-warmup-step-decay schedule",
            ".training",
        ),
        cel(
            f"!({translation}) || (has(self.dataset) && self.dataset.format in {list(TRANSLATION_FORMATS)})",
            "a translation task reads parallel-text or generates the synthetic pair (format synthetic)",
            ".dataset",
        ),
        cel(
            f"!({translation}) || (has(self.goal) && self.goal.metric in {list(TRANSLATION_METRICS)})",
            "a translation task's goal is bleu, perplexity or loss",
            ".goal",
        ),
        cel(
            "!has(self.training) || !has(self.training.translation) || "
            "!has(self.training.translation.coveragePenalty) || self.training.translation.coveragePenalty == 0.0 "
            "|| (has(self.model) && self.model.name == 'gnmt')",
            "translation.coveragePenalty needs a model that reports its attention (gnmt)",
            ".training",
        ),
        cel(
            f"{translation} || !has(self.training) || (!has(self.training.translation) && "
            f"!(self.training.learningRate.schedule in {schedules}))",
            "training.translation and the translation schedules are a translation task's",
            ".training",
        ),
        cel(
            f"{translation} || !has(self.dataset) || self.dataset.format != 'parallel-text'",
            "the parallel-text format is a translation task's",
            ".dataset",
        ),
        cel(
            f"{translation} || !has(self.goal) || !(self.goal.metric == 'bleu' || "
            f"(self.goal.metric == 'perplexity' && !({awd})))",
            "bleu goals are a translation task's, perplexity goals a translation or awd-lstm task's",
            ".goal",
        ),
    ]


#: The four sections of a training task, by wire name; a collectives task has none of them.
TRAINING_SECTIONS = ("model", "dataset", "training", "goal")


def _training_task_rules() -> list[Any]:
    rules: list[Any] = [
        cel(
            "!has(self.collectives) || !(" + " || ".join(f"has(self.{s})" for s in TRAINING_SECTIONS) + ")",
            "a collectives task has no model, dataset, training or goal",
            ".collectives",
        ),
        cel(
            "!has(self.collectives) || !has(self.overridable) || size(self.overridable) == 0",
            "a collectives task has no hyperparameters to override",
            ".overridable",
        ),
    ]
    translation = f"has(self.model) && self.model.name in {list(TRANSLATION_MODELS)}"
    awd = "has(self.model) && self.model.name == 'awd-lstm'"
    rules += _translation_rules(translation, awd)
    rules += _language_model_rules(awd)
    rules += [
        cel(
            f"has(self.collectives) || has(self.{section})",
            f"{section} is required (unless the task sets collectives)",
            f".{section}",
        )
        for section in TRAINING_SECTIONS
    ]
    return rules


class BenchmarkTaskSpec(ApiModel):
    """A benchmark task, the unit of comparison: model, data, training recipe and goal, or instead collectives (a
    timing of the backend's collectives, task 0a). Runs copy it at admission."""

    # model, dataset, training and goal are optional on the wire only because a collectives task has none of them
    # (the validator and the CEL rules require all four otherwise). They are stored as model_spec, dataset_spec,
    # training_spec and goal_spec; the properties model, dataset, training and goal return them typed and raise a
    # ValueError naming the field on a collectives task, so training code never handles None. Where both kinds of
    # task can arrive, check has_training first. model_copy(update=...) maps the wire names to the *_spec fields.
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _training_task_rules()})

    division: Division
    """closed: the reference hyperparameters, runs may override only what overridable lists; open: runs may override
    anything."""
    description: Annotated[str, Field(max_length=8192)] = ""
    """Free text for humans: what the task is and where it differs from the reference; not interpreted."""
    model_spec: ModelSpec | None = Field(default=None, alias="model")
    """The model to train. Required unless collectives is set."""
    dataset_spec: DatasetSpec | None = Field(default=None, alias="dataset")
    """The data: where it lives or how it is fetched or generated. Required unless collectives is set."""
    training_spec: Training | None = Field(default=None, alias="training")
    """The optimisation recipe, per worker process. Required unless collectives is set."""
    goal_spec: Goal | None = Field(default=None, alias="goal")
    """When the run counts as done and what it reports. Required unless collectives is set."""
    collectives: CollectiveBenchmark | None = None
    """Instead of model, dataset, training and goal: time the backend's all-reduce, all-gather and broadcast over a
    ladder of message sizes (task 0a; docs/collectives.md). The runner command is then mlbench-runner collectives."""
    runner: RunnerSpec = Field(default_factory=RunnerSpec)
    """The container that trains every rank (default: the operator's runner image, mlbench-runner train)."""
    overridable: Annotated[list[Overridable], Field(max_length=16)] = Field(
        default_factory=list,
        description="Hyperparameters a closed-division run may override; open-division runs may override any.",
    )
    algorithms: Annotated[list[Algorithm], Field(min_length=1, max_length=16)] = Field(
        default_factory=lambda: list(REFERENCE_ALGORITHMS),
        description="Algorithms (BenchmarkRun.spec.algorithm) a closed-division run may use (default allreduce-sgd "
        "and ddp, the reference update); others fail the run AlgorithmNotAllowed. Open-division runs may use any.",
    )

    @model_validator(mode="after")
    def _kind(self) -> BenchmarkTaskSpec:
        # Mirrors the CEL rules of _training_task_rules, with the same fields named.
        present = [name for name in TRAINING_SECTIONS if getattr(self, f"{name}_spec") is not None]
        if self.collectives is not None:
            if present:
                raise ValueError(
                    "collectives: a collectives task has no model, dataset, training or goal "
                    f"(got {', '.join(present)})"
                )
            if self.overridable:
                raise ValueError("overridable: a collectives task has no hyperparameters to override")
            return self
        missing = [name for name in TRAINING_SECTIONS if name not in present]
        if missing:
            raise ValueError(f"{missing[0]}: {missing[0]} is required (unless the task sets collectives)")
        if errors := task_kind_errors(self.model, self.dataset, self.training, self.goal):
            raise ValueError(errors[0])
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """pydantic's model_copy, also taking the wire names model, dataset, training and goal in ``update``
        (the properties would otherwise hide the copied value)."""
        if update:
            update = {f"{k}_spec" if k in TRAINING_SECTIONS else k: v for k, v in update.items()}
        return super().model_copy(update=update, deep=deep)

    @property
    def has_training(self) -> bool:
        """True for a training task (model, dataset, training, goal); False for a collectives task."""
        return self.collectives is None

    @property
    def model(self) -> ModelSpec:
        """The model; raises ValueError on a collectives task."""
        if self.model_spec is None:
            raise _no_section("model")
        return self.model_spec

    @property
    def dataset(self) -> DatasetSpec:
        """The dataset; raises ValueError on a collectives task."""
        if self.dataset_spec is None:
            raise _no_section("dataset")
        return self.dataset_spec

    @property
    def training(self) -> Training:
        """The training recipe; raises ValueError on a collectives task."""
        if self.training_spec is None:
            raise _no_section("training")
        return self.training_spec

    @property
    def goal(self) -> Goal:
        """The goal; raises ValueError on a collectives task."""
        if self.goal_spec is None:
            raise _no_section("goal")
        return self.goal_spec


def _no_section(name: str) -> ValueError:
    return ValueError(f"{name}: this is a collectives task, it has no {name} (check has_training first)")


class BenchmarkTask(ApiModel):
    """``mlbench.io/v1alpha1 BenchmarkTask`` (cluster-scoped, short name ``bt``)."""

    api_version: Literal["mlbench.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["BenchmarkTask"] = "BenchmarkTask"
    metadata: ObjectMeta
    spec: BenchmarkTaskSpec

    @model_validator(mode="after")
    def _name(self) -> Self:
        # A run's pods carry the task's name as a label value: a longer name could be stored but never run.
        if len(self.metadata.name) > MAX_LABEL_VALUE:
            raise ValueError(
                f"metadata.name: at most {MAX_LABEL_VALUE} characters, as runs label their pods with it "
                "(mlbench.io/task)"
            )
        if not re2_search(DNS1123_SUBDOMAIN, self.metadata.name):  # the API server's rule for every object name
            raise ValueError("metadata.name: must be a DNS-1123 subdomain (lowercase a-z, 0-9, '-' and '.')")
        return self
