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

from pydantic import ConfigDict, Field, model_validator

from mlbench_api.collectives import CollectiveBenchmark
from mlbench_api.common import (
    API_VERSION,
    DNS1123_SUBDOMAIN,
    MAX_LABEL_VALUE,
    ApiModel,
    ObjectMeta,
    cel,
    re2_search,
)
from mlbench_api.dataspec import DatasetFormat, DatasetSpec
from mlbench_api.goal import Goal, GoalMetric
from mlbench_api.model import ModelName, ModelSpec
from mlbench_api.pod import PodSettings
from mlbench_api.schedule import TRANSLATION_SCHEDULES, Schedule
from mlbench_api.training import REFERENCE_ALGORITHMS, Algorithm, Optimizer, Training


class Division(StrEnum):
    """Closed: reference hyperparameters, only listed overrides. Open: anything goes."""

    CLOSED = "closed"
    OPEN = "open"


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
    pod: PodSettings | None = None
    """Pod settings of every run of the task, as a run's spec.pod, merged under it by name or key. Closed
    division: a run may add settings, not change these (OverrideNotAllowed). Policy-checked as a run's."""
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
