"""``BenchmarkRun``: one execution of a task on N workers, and the truth about it.

The spec is what the user asked for; the status is written only by the operator (the
status subresource) and carries the task snapshot the run started from, so results stay
interpretable after the task changes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mlbench_api.common import (
    API_VERSION,
    DNS1035_LABEL,
    MAX_SAFE_INT,
    ApiModel,
    LabelName,
    ObjectMeta,
    Quantity,
    cel,
    re2_search,
)
from mlbench_api.dataspec import DatasetSource
from mlbench_api.model import ModelSpec
from mlbench_api.network import NetworkConditions
from mlbench_api.parameters import PARAMETER_DEFAULTS, AlgorithmParameters
from mlbench_api.pod import PodSettings
from mlbench_api.runpolicy import CheckpointPolicy, RunPolicy
from mlbench_api.runstatus import BenchmarkRunStatus
from mlbench_api.scheduling import Placement, Scheduling
from mlbench_api.training import Algorithm, Optimizer

#: Longest run name such that ``<run>-worker-<N>`` (N < 10000) stays a 63-character DNS label.
MAX_RUN_NAME = 63 - len("-worker-") - 4
MAX_WORKERS = 1024


class Backend(StrEnum):
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"


class Bucketing(StrEnum):
    BY_MODEL = "by-model"  #: one flat buffer for the whole model (default)
    BY_LAYER = "by-layer"  #: one all-reduce per parameter tensor


class GoalSelection(StrEnum):
    FULL = "full"
    LIGHT = "light"


class TaskRef(ApiModel):
    """The BenchmarkTask a run executes."""

    name: LabelName
    """Name of the (cluster-scoped) BenchmarkTask; its spec is copied into status.taskSnapshot at admission. At most
    63 characters: it labels the run's pods (mlbench.io/task), and a label value is no longer."""


class Resources(ApiModel):
    """Per-worker resources; requests equal limits (a benchmark wants guaranteed QoS)."""

    cpu: Quantity | None = None
    """CPU request and limit of each worker pod, in cores (e.g. 4 or 500m). Unset: none."""
    memory: Quantity | None = None
    """Memory request and limit of each worker pod (e.g. 8Gi); a rank exceeding it fails the run as OOMKilled."""
    gpu: Annotated[int, Field(ge=0, le=16)] = 0
    """nvidia.com/gpu per worker pod (default 0); backend nccl needs at least 1, and slotsPerWorker at most this."""


class RunOverrides(ApiModel):
    """Hyperparameters a run replaces; names match ``BenchmarkTask.spec.overridable``."""

    optimizer: Optimizer | None = None
    """Replaces training.optimizer."""
    batch_size_per_worker: Annotated[int, Field(ge=1, le=65536)] | None = None
    """Replaces training.batchSizePerWorker (samples per step per rank)."""
    learning_rate: Annotated[float, Field(gt=0, le=1e6)] | None = Field(
        default=None,
        description="Replaces the per-sample rate (multistep, at most 10), alpha (inverse-sqrt: 2a's are 200 to "
        "800) or the value; up to 1e6, then checked against the schedule's own bound.",
    )
    momentum: Annotated[float, Field(ge=0, lt=1)] | None = None
    """Replaces training.momentum."""
    nesterov: bool | None = None
    """Replaces training.nesterov."""
    weight_decay: Annotated[float, Field(ge=0, le=1)] | None = None
    """Replaces training.weightDecay."""
    l2_regularization: Annotated[float, Field(ge=0, le=1)] | None = None
    """Replaces training.l2Regularization."""
    max_epochs: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """Replaces training.maxEpochs (must stay above the warm-up and every milestone)."""
    model: ModelSpec | None = None
    """Replaces the whole model (e.g. another ResNet depth or version)."""
    train_subset: Annotated[int, Field(ge=1, le=MAX_SAFE_INT)] | None = None
    """Replaces dataset.trainSubset: train on the first N samples only."""
    dataset: Annotated[str, Field(max_length=4096)] | None = Field(default=None, description="Replaces dataset.path.")
    dataset_source: DatasetSource | None = Field(
        default=None,
        description=(
            "Replaces dataset.source (e.g. an in-cluster mirror); the closed division requires the task's sha256."
        ),
    )
    time_budget_seconds: Annotated[int, Field(ge=1, le=30 * 24 * 3600)] | None = None
    """Replaces goal.timeBudgetSeconds (used in the accuracy-after-time mode)."""

    def names(self) -> list[str]:
        """The overridden hyperparameters, by wire name."""
        return sorted(self.model_dump(by_alias=True, exclude_none=True))


#: The runner's DDP wraps torch.distributed (gloo or nccl); backend mpi goes through mpi4py, which DDP cannot use.
DDP_NEEDS_TORCH_BACKEND = "ddp needs backend gloo or nccl (torch.distributed), not mpi"

#: Each pod carries what is left of the deadline (the kubelet ends it even while the operator is down), and
#: Kubernetes lets a pod's activeDeadlineSeconds be lowered, never raised or removed: a raised run deadline
#: would still see its pods killed at the old one, and restarted as if they had failed.
DEADLINE_ONLY_LOWERED = (
    "runPolicy.activeDeadlineSeconds may be lowered, not raised or removed: every pod carries it, and Kubernetes "
    "cannot extend a pod's deadline"
)
DEADLINE_ONLY_LOWERED_RULE = (
    "!has(oldSelf.runPolicy) || !has(oldSelf.runPolicy.activeDeadlineSeconds) || "
    "(has(self.runPolicy) && has(self.runPolicy.activeDeadlineSeconds) && "
    "self.runPolicy.activeDeadlineSeconds <= oldSelf.runPolicy.activeDeadlineSeconds)"
)

#: ``spec.managedBy`` of the runs this operator reconciles (unset means the same); any other value: another
#: controller's run, which the operator leaves alone (Kubernetes Job semantics).
MANAGED_BY_OPERATOR = "mlbench.io/operator"
#: spec.network's tc would shape the node's own interface in the node's network namespace.
HOST_NETWORK_NOT_WITH_NETEM = "not with network (tc would shape the node's own interface)"
#: Each worker's sshd (2222) and metrics ports (9400 on) are the node's with hostNetwork: two on a node collide.
HOST_NETWORK_ONE_PER_NODE = (
    "needs scheduling.placement OneWorkerPerNode (each worker's sshd and metrics ports are the node's)"
)

#: The reason of a refused transition (an immutable field, a raised deadline).
FORBIDDEN = "FieldValueForbidden"

#: The message of the immutability rule.
IMMUTABLE_SPEC = "spec is immutable except runPolicy, suspend and scheduling"

#: Fields of the spec that may change after creation; everything else is immutable (scheduling only while the
#: run is suspended: :data:`SCHEDULING_WHILE_SUSPENDED_RULE`).
MUTABLE_SPEC_FIELDS = ("runPolicy", "suspend", "scheduling")

#: As for a suspended Job: the pods' placement may change while the run is (or was, in the same update) suspended,
#: which is when a queue (Kueue) decides where it goes; otherwise it is fixed with the pods that carry it.
SCHEDULING_WHILE_SUSPENDED = "scheduling may change only while the run is suspended (spec.suspend)"
SCHEDULING_WHILE_SUSPENDED_RULE = (
    "(has(oldSelf.suspend) && oldSelf.suspend) || "
    "(has(self.scheduling) == has(oldSelf.scheduling) && "
    "(!has(self.scheduling) || self.scheduling == oldSelf.scheduling))"
)
#: A finished run cannot be suspended or resumed (checked on the whole object: the rule reads the status).
SUSPEND_FINISHED = "spec.suspend cannot change once the run has finished (status.phase Succeeded or Failed)"
SUSPEND_FINISHED_RULE = (
    "!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ['Succeeded', 'Failed']) || "
    "(has(self.spec.suspend) ? self.spec.suspend : false) == (has(oldSelf.spec.suspend) ? oldSelf.spec.suspend : false)"
)


def _parameter_rules() -> list[dict[str, Any]]:
    """Each algorithm parameter only with its own algorithm."""
    return [
        cel(
            f"!has(self.algorithmParameters) || !has(self.algorithmParameters.{name}) || "
            f"self.algorithm == '{owner.value}'",
            f"algorithmParameters.{name} is for algorithm {owner.value} only",
            f".algorithmParameters.{name}",
        )
        for name, (owner, _default) in PARAMETER_DEFAULTS.items()
    ]


def _spec_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """CEL rules of the run spec; the immutability rule is derived from the fields themselves. A sweep's
    template (``PARAMETERS_OF_ITS_ALGORITHM`` false) leaves the parameters to the sweep's own rules."""
    schema["x-kubernetes-validations"] = [
        cel(
            "self.backend != 'nccl' || (has(self.resources) && self.resources.gpu >= 1)",
            "nccl needs resources.gpu >= 1",
            ".backend",
        ),
        cel(
            "self.algorithm != 'ddp' || self.backend != 'mpi'",
            DDP_NEEDS_TORCH_BACKEND,
            ".algorithm",
        ),
        *(_parameter_rules() if getattr(cls, "PARAMETERS_OF_ITS_ALGORITHM", True) else []),
        cel(
            "!has(self.resources) || self.resources.gpu == 0 || self.slotsPerWorker <= self.resources.gpu",
            "slotsPerWorker must not exceed resources.gpu",
            ".slotsPerWorker",
        ),
        cel(
            "!has(self.pod) || !has(self.pod.hostNetwork) || !self.pod.hostNetwork || !has(self.network)",
            HOST_NETWORK_NOT_WITH_NETEM,
            ".pod.hostNetwork",
        ),
        cel(
            "!has(self.pod) || !has(self.pod.hostNetwork) || !self.pod.hostNetwork || (has(self.scheduling) && "
            "has(self.scheduling.placement) && self.scheduling.placement == 'OneWorkerPerNode')",
            HOST_NETWORK_ONE_PER_NODE,
            ".pod.hostNetwork",
        ),
        cel(_immutability_rule(cls), IMMUTABLE_SPEC, reason=FORBIDDEN),
        cel(SCHEDULING_WHILE_SUSPENDED_RULE, SCHEDULING_WHILE_SUSPENDED, ".scheduling", FORBIDDEN),
        *(
            [cel(DEADLINE_ONLY_LOWERED_RULE, DEADLINE_ONLY_LOWERED, ".runPolicy.activeDeadlineSeconds", FORBIDDEN)]
            if getattr(cls, "PODS_CARRY_THE_DEADLINE", True)
            else []
        ),
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
    """Which task to run and how: workers, resources, backend, algorithm, overrides. Immutable except runPolicy,
    suspend, and scheduling while suspended."""

    model_config = ConfigDict(json_schema_extra=_spec_rules)
    #: algorithmParameters may hold only spec.algorithm's parameters (a sweep's template: any of its runs').
    PARAMETERS_OF_ITS_ALGORITHM: ClassVar[bool] = True
    #: Its pods carry runPolicy.activeDeadlineSeconds, so it may only be lowered (a sweep's template has no
    #: pods: its edits apply to the runs created afterwards).
    PODS_CARRY_THE_DEADLINE: ClassVar[bool] = True

    task_ref: TaskRef
    """The BenchmarkTask to run."""
    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 1
    """Worker pods (1 to 1024, default 1); the world size is workers x slotsPerWorker processes."""
    slots_per_worker: Annotated[int, Field(ge=1, le=64)] = Field(
        default=1,
        description="Processes (ranks) per worker pod, default 1; with GPUs at most resources.gpu "
        "(one per GPU with nccl).",
    )
    resources: Resources | None = None
    """Per-worker resources (requests = limits). Unset: none."""
    backend: Backend = Backend.GLOO
    """Collectives: gloo (default, torch.distributed on CPU), nccl (GPUs, needs resources.gpu >= 1) or mpi (OpenMPI
    through mpi4py, CPU; not with algorithm ddp)."""
    algorithm: Algorithm = Algorithm.ALLREDUCE_SGD
    """allreduce-sgd (default, the reference), ddp (not with backend mpi), centralized-adam, powersgd,
    decentralized-sgd, sign-sgd or sparsified-sgd (docs/algorithms.md). A closed-division task allows only those it
    lists in algorithms (default allreduce-sgd and ddp)."""
    algorithm_parameters: AlgorithmParameters | None = None
    """Parameters of the chosen algorithm (powersgd: rank, warmStart; decentralized-sgd: topology; sparsified-sgd:
    density, selection); a field of another algorithm is refused."""
    network: NetworkConditions | None = None
    """Emulated bandwidth, latency and loss between the workers (tc htb and netem; needs NET_ADMIN, off unless the
    operator allows it). Unset: the cluster's network as it is."""
    bucketing: Bucketing = Bucketing.BY_MODEL
    """allreduce-sgd only: by-model (default, one all-reduce of the whole gradient) or by-layer (one per parameter
    tensor)."""
    overrides: RunOverrides | None = None
    """Hyperparameters replaced for this run; in the closed division only those the task lists in overridable, else
    the run fails OverrideNotAllowed."""
    goal: GoalSelection = GoalSelection.FULL
    """Which target of the task counts: full (goal.target, default) or light (goal.lightTarget)."""
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 42
    """Seed of the model initialisation, the data shuffling and the augmentation (default 42)."""
    image: Annotated[str, Field(max_length=512)] | None = None
    """Container image of the run's pods instead of the task's runner.image (e.g. your registry's copy)."""
    scheduling: Scheduling | None = None
    """nodeSelector, tolerations and priorityClassName for every pod of the run."""
    pod: PodSettings | None = None
    """What multi-node GPU training needs of the worker pods: env (also the launcher's, forwarded to every rank),
    annotations, labels, extendedResources, affinity, topologySpreadConstraints, hostNetwork, hostIPC; each
    allowed or refused by the operator's admission policy (docs/operator.md#gpu-clusters)."""
    checkpoint: CheckpointPolicy | None = None
    """Epoch-end checkpoints on a volume, resumed after a gang restart (docs/runner.md#checkpoints). Unset: none;
    a restarted run trains from epoch 0."""
    run_policy: RunPolicy | None = None
    """Restarts, deadline, cleanup and TTL; may change after creation (deadline: only lowered)."""
    suspend: bool = False
    """As for a Job: true creates no pods (a running run releases its pods: phase Suspended); false (default) starts
    or resumes it, from a new attempt that does not count against maxRestarts. May change until the run finishes.
    A run with the label kueue.x-k8s.io/queue-name also waits for its Kueue Workload's admission."""
    managed_by: Annotated[str, Field(min_length=1, max_length=63)] | None = None
    """As for a Job: the controller that reconciles this run. Unset or mlbench.io/operator (MANAGED_BY_OPERATOR): the
    MLBench operator;
    any other value: the operator leaves the run alone (e.g. MultiKueue's). Immutable."""

    @model_validator(mode="after")
    def _rules(self) -> BenchmarkRunSpec:
        gpus = self.resources.gpu if self.resources else 0
        if self.backend is Backend.NCCL and gpus < 1:
            raise ValueError("backend: nccl needs resources.gpu >= 1")
        if self.algorithm is Algorithm.DDP and self.backend is Backend.MPI:
            raise ValueError(f"algorithm: {DDP_NEEDS_TORCH_BACKEND}")
        parameters = self.algorithm_parameters if self.PARAMETERS_OF_ITS_ALGORITHM else None
        misplaced = parameters.misplaced(self.algorithm) if parameters else []
        if misplaced:
            owner = PARAMETER_DEFAULTS[misplaced[0]][0].value
            raise ValueError(f"algorithmParameters.{misplaced[0]}: is for algorithm {owner} only")
        if gpus and self.slots_per_worker > gpus:
            raise ValueError("slotsPerWorker: more slots than GPUs per worker")
        problem = host_network_problem(self, self.pod)
        if problem:
            raise ValueError(f"pod.hostNetwork: {problem}")
        return self


def host_network_problem(spec: BenchmarkRunSpec, pod: PodSettings | None) -> str | None:
    """What ``spec`` lacks for ``pod``'s hostNetwork (the run's own, or merged with its task's); None: nothing."""
    if pod is None or not pod.host_network:
        return None
    if spec.network is not None:
        return HOST_NETWORK_NOT_WITH_NETEM
    if spec.scheduling is None or spec.scheduling.placement is not Placement.ONE_WORKER_PER_NODE:
        return HOST_NETWORK_ONE_PER_NODE
    return None


class BenchmarkRun(ApiModel):
    """``mlbench.io/v1alpha1 BenchmarkRun`` (namespaced, short name ``br``)."""

    api_version: Literal["mlbench.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["BenchmarkRun"] = "BenchmarkRun"
    metadata: ObjectMeta
    spec: BenchmarkRunSpec
    status: BenchmarkRunStatus | None = None

    @model_validator(mode="after")
    def _name(self) -> BenchmarkRun:

        name = self.metadata.name
        if len(name) > MAX_RUN_NAME:
            raise ValueError(f"metadata.name: at most {MAX_RUN_NAME} characters so pod names stay valid DNS labels")
        if not re2_search(DNS1035_LABEL, name):
            raise ValueError("metadata.name: must be a DNS-1035 label (lowercase letter first; a-z, 0-9, '-')")
        return self
