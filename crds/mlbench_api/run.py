"""``BenchmarkRun``: one execution of a task on N workers, and the truth about it.

The spec is what the user asked for; the status is written only by the operator (the
status subresource) and carries the task snapshot the run started from, so results stay
interpretable after the task changes.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mlbench_api.common import (
    API_VERSION,
    MAX_INT32,
    MAX_SAFE_INT,
    ApiModel,
    Condition,
    Finite,
    Name,
    ObjectMeta,
    Quantity,
    SafeInt,
    cel,
)
from mlbench_api.task import BenchmarkTaskSpec, DatasetSource, ModelSpec, Optimizer

#: Longest run name such that ``<run>-worker-<N>`` (N < 10000) stays a 63-character DNS label.
MAX_RUN_NAME = 63 - len("-worker-") - 4
MAX_WORKERS = 1024


class Backend(StrEnum):
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"


class Algorithm(StrEnum):
    ALLREDUCE_SGD = "allreduce-sgd"  #: the reference: flatten, all-reduce, average, step
    DDP = "ddp"  #: torch DistributedDataParallel, the comparison baseline


class Bucketing(StrEnum):
    BY_MODEL = "by-model"  #: one flat buffer for the whole model (default)
    BY_LAYER = "by-layer"  #: one all-reduce per parameter tensor


class GoalSelection(StrEnum):
    FULL = "full"
    LIGHT = "light"


class TaskRef(ApiModel):
    name: Name


class Resources(ApiModel):
    """Per-worker resources; requests equal limits (a benchmark wants guaranteed QoS)."""

    cpu: Quantity | None = None
    memory: Quantity | None = None
    gpu: Annotated[int, Field(ge=0, le=16)] = 0


class RunOverrides(ApiModel):
    """Hyperparameters a run replaces; names match ``BenchmarkTask.spec.overridable``."""

    optimizer: Optimizer | None = None
    batch_size_per_worker: Annotated[int, Field(ge=1, le=65536)] | None = None
    learning_rate: Annotated[float, Field(gt=0, le=10)] | None = Field(
        default=None, description="Replaces the per-sample rate (multistep), alpha (inverse-sqrt) or the value."
    )
    momentum: Annotated[float, Field(ge=0, lt=1)] | None = None
    nesterov: bool | None = None
    weight_decay: Annotated[float, Field(ge=0, le=1)] | None = None
    l2_regularization: Annotated[float, Field(ge=0, le=1)] | None = None
    max_epochs: Annotated[int, Field(ge=1, le=100_000)] | None = None
    model: ModelSpec | None = None
    train_subset: Annotated[int, Field(ge=1)] | None = None
    dataset: Annotated[str, Field(max_length=4096)] | None = Field(default=None, description="Replaces dataset.path.")
    dataset_source: DatasetSource | None = Field(
        default=None,
        description=(
            "Replaces dataset.source (e.g. an in-cluster mirror); the closed division requires the task's sha256."
        ),
    )
    time_budget_seconds: Annotated[int, Field(ge=1, le=30 * 24 * 3600)] | None = None

    def names(self) -> list[str]:
        """The overridden hyperparameters, by wire name."""
        return sorted(self.model_dump(by_alias=True, exclude_none=True))


class Toleration(ApiModel):
    key: Annotated[str, Field(max_length=316)] | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: Annotated[str, Field(max_length=63)] | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class Scheduling(ApiModel):
    node_selector: Annotated[dict[str, str], Field(max_length=32)] | None = None
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = None
    priority_class_name: Annotated[str, Field(max_length=253)] | None = None


class CleanPodPolicy(StrEnum):
    """What to delete when a run finishes (Kubeflow's meanings)."""

    RUNNING = "Running"  #: delete unfinished pods (launcher included); keep finished ones for their logs
    ALL = "All"  #: delete every pod
    NONE = "None"  #: keep every pod


class RunPolicy(ApiModel):
    active_deadline_seconds: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = Field(
        default=None,
        description="Seconds from the run's start until it fails with DeadlineExceeded (1 to 2^31-1, as for a Pod).",
    )
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = Field(
        default=None,
        description="Seconds a finished run is kept before it is deleted (0 to 2^31-1, as for a Job).",
    )


#: Fields of the spec that may change after creation; everything else is immutable.
MUTABLE_SPEC_FIELDS = ("runPolicy",)


def _spec_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """CEL rules of the run spec; the immutability rule is derived from the fields themselves."""
    schema["x-kubernetes-validations"] = [
        cel(
            "self.backend != 'nccl' || (has(self.resources) && self.resources.gpu >= 1)",
            "nccl needs resources.gpu >= 1",
            ".backend",
        ),
        cel(
            "!has(self.resources) || self.resources.gpu == 0 || self.slotsPerWorker <= self.resources.gpu",
            "slotsPerWorker must not exceed resources.gpu",
            ".slotsPerWorker",
        ),
        cel(_immutability_rule(cls), "spec is immutable except runPolicy", reason="FieldValueForbidden"),
    ]


def _immutability_rule(cls: type[BaseModel]) -> str:
    parts = []
    fields = [(info.alias or name, info.is_required()) for name, info in cls.model_fields.items()]
    for alias, required in fields:
        if alias in MUTABLE_SPEC_FIELDS:
            continue
        if required:
            parts.append(f"self.{alias} == oldSelf.{alias}")
        else:
            parts.append(
                f"has(self.{alias}) == has(oldSelf.{alias}) && (!has(self.{alias}) || self.{alias} == oldSelf.{alias})"
            )
    return " && ".join(parts)


class BenchmarkRunSpec(ApiModel):
    """What to run and how."""

    model_config = ConfigDict(json_schema_extra=_spec_rules)

    task_ref: TaskRef
    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 1
    slots_per_worker: Annotated[int, Field(ge=1, le=64)] = Field(
        default=1, description="Processes per worker pod (one per GPU with nccl)."
    )
    resources: Resources | None = None
    backend: Backend = Backend.GLOO
    algorithm: Algorithm = Algorithm.ALLREDUCE_SGD
    bucketing: Bucketing = Bucketing.BY_MODEL
    overrides: RunOverrides | None = None
    goal: GoalSelection = GoalSelection.FULL
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 42
    image: Annotated[str, Field(max_length=512)] | None = None
    scheduling: Scheduling | None = None
    run_policy: RunPolicy | None = None

    @model_validator(mode="after")
    def _rules(self) -> BenchmarkRunSpec:
        gpus = self.resources.gpu if self.resources else 0
        if self.backend is Backend.NCCL and gpus < 1:
            raise ValueError("backend: nccl needs resources.gpu >= 1")
        if gpus and self.slots_per_worker > gpus:
            raise ValueError("slotsPerWorker: more slots than GPUs per worker")
        return self


class Phase(StrEnum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class WorkerCounts(ApiModel):
    ready: Annotated[int, Field(ge=0)] = 0
    total: Annotated[int, Field(ge=0)] = 0


class Progress(ApiModel):
    """Live view scraped from rank 0; best effort."""

    epoch: Annotated[Finite, Field(ge=0)] | None = None
    step: Annotated[int, Field(ge=0, le=MAX_SAFE_INT)] | None = None
    last_accuracy: Annotated[Finite, Field(ge=0, le=1)] | None = None
    samples_per_second: Annotated[Finite, Field(ge=0)] | None = None
    updated_at: datetime | None = None


class RunResult(ApiModel):
    """The final figures, copied from the launcher's termination message."""

    goal_reached: bool
    time_to_goal_seconds: Finite | None = None
    best_accuracy: Finite | None = None
    final_accuracy: Finite | None = None
    epochs: Finite | None = None
    wall_clock_seconds: Finite | None = None
    compute_seconds: Finite | None = None
    communication_seconds: Finite | None = None
    samples_per_second: Finite | None = None
    world_size: SafeInt | None = None


class ResultsRef(ApiModel):
    """Where the run's full results (summary with history, event log, config) are kept, or why not.

    ``mlbench results <namespace>/<run>`` downloads them; the ConfigMap is owned by the run.
    """

    config_map: str | None = Field(default=None, description="ConfigMap holding the gzip files (binaryData).")
    files: Annotated[list[str], Field(max_length=8)] | None = None
    compressed_bytes: Annotated[int, Field(ge=0)] | None = None
    truncated: Annotated[list[str], Field(max_length=8)] | None = Field(
        default=None, description="Files cut to fit the 1 MiB ConfigMap limit (the event log only)."
    )
    collected_at: datetime | None = None
    message: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="Why no results were kept (e.g. the launcher never ran mpirun)."
    )


class BenchmarkRunStatus(ApiModel):
    phase: Phase | None = None
    conditions: Annotated[list[Condition], Field(max_length=16)] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = None
    start_time: datetime | None = None
    completion_time: datetime | None = None
    workers: WorkerCounts | None = None
    restarts: Annotated[int, Field(ge=0)] | None = None
    progress: Progress | None = None
    result: RunResult | None = None
    results: ResultsRef | None = None
    message: Annotated[str, Field(max_length=32768)] | None = None
    task_snapshot: BenchmarkTaskSpec | None = None


class BenchmarkRun(ApiModel):
    """``mlbench.io/v1alpha1 BenchmarkRun`` (namespaced, short name ``br``)."""

    api_version: Literal["mlbench.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["BenchmarkRun"] = "BenchmarkRun"
    metadata: ObjectMeta
    spec: BenchmarkRunSpec
    status: BenchmarkRunStatus | None = None

    @model_validator(mode="after")
    def _name(self) -> BenchmarkRun:
        import re

        from mlbench_api.common import DNS1035_LABEL

        name = self.metadata.name
        if len(name) > MAX_RUN_NAME:
            raise ValueError(f"metadata.name: at most {MAX_RUN_NAME} characters so pod names stay valid DNS labels")
        if not re.match(DNS1035_LABEL, name):
            raise ValueError("metadata.name: must be a DNS-1035 label (lowercase letter first; a-z, 0-9, '-')")
        return self
