"""``BenchmarkRun``: one execution of a task on N workers, and the truth about it.

The spec is what the user asked for; the status is written only by the operator (the
status subresource) and carries the task snapshot the run started from, so results stay
interpretable after the task changes.
"""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mlbench_api import contract
from mlbench_api.common import (
    API_VERSION,
    DNS1035_LABEL,
    MAX_INT32,
    MAX_LABEL_VALUE,
    MAX_SAFE_INT,
    ApiModel,
    Condition,
    Finite,
    LabelName,
    Name,
    ObjectMeta,
    Quantity,
    SafeInt,
    cel,
    re2_search,
)
from mlbench_api.pod import PodSettings
from mlbench_api.task import Algorithm, BenchmarkTaskSpec, DatasetSource, GoalMetric, ModelSpec, Optimizer

#: Longest run name such that ``<run>-worker-<N>`` (N < 10000) stays a 63-character DNS label.
MAX_RUN_NAME = 63 - len("-worker-") - 4
MAX_WORKERS = 1024
#: Most files a run's kept results may name (status.results.files and .truncated); the results bundle
#: (mlbench_api.bundle) refuses more, so a launcher's line can never produce a status the API server refuses.
MAX_RESULT_FILES = 8


class Backend(StrEnum):
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"


class Topology(StrEnum):
    """Who a decentralized rank averages with after each local step."""

    RING = "ring"  #: its two ring neighbours (rank +- 1 mod k), weights 1/3 each (1/2 each for 2 ranks)
    COMPLETE = "complete"  #: every rank (an all-reduce of the parameters: exact averaging)


class Selection(StrEnum):
    """Which gradient entries sparsified SGD sends."""

    TOP_K = "top-k"  #: the k largest in magnitude (after adding the error memory); values and indices all-gathered
    RANDOM_K = "random-k"  #: k indices drawn from a generator seeded alike on every rank; values all-reduced


#: The algorithms each AlgorithmParameters field belongs to, and its default there.
PARAMETER_DEFAULTS: dict[str, tuple[Algorithm, object]] = {
    "rank": (Algorithm.POWERSGD, 2),
    "warmStart": (Algorithm.POWERSGD, True),
    "topology": (Algorithm.DECENTRALIZED_SGD, Topology.RING),
    "density": (Algorithm.SPARSIFIED_SGD, 0.01),
    "selection": (Algorithm.SPARSIFIED_SGD, Selection.TOP_K),
}


class AlgorithmParameters(ApiModel):
    """Knobs of the compressing and decentralized algorithms; each field belongs to one algorithm only."""

    rank: Annotated[int, Field(ge=1, le=64)] | None = None
    """powersgd: rank r of the low-rank approximation P Q^T of each gradient matrix (1 to 64, default 2)."""
    warm_start: bool | None = None
    """powersgd: start each step's power iteration from the previous step's Q (default true), as the paper does."""
    topology: Topology | None = None
    """decentralized-sgd: ring (default; gossip with the two ring neighbours) or complete (average with every rank)."""
    density: Annotated[float, Field(gt=0, le=1)] | None = None
    """sparsified-sgd: fraction of each step's gradient entries sent, k = ceil(density x parameters) (default 0.01)."""
    selection: Selection | None = None
    """sparsified-sgd: top-k (default) or random-k."""

    def misplaced(self, *algorithms: Algorithm) -> list[str]:
        """Wire names of the fields set that belong to none of ``algorithms``."""
        given = self.model_dump(by_alias=True, exclude_none=True)
        return [name for name in PARAMETER_DEFAULTS if name in given and PARAMETER_DEFAULTS[name][0] not in algorithms]

    def for_algorithm(self, algorithm: Algorithm) -> AlgorithmParameters:
        """These parameters with ``algorithm``'s defaults filled in (the others stay unset)."""
        data = self.model_dump(by_alias=True, exclude_none=True)
        for name, (owner, default) in PARAMETER_DEFAULTS.items():
            if owner is algorithm:
                data.setdefault(name, default)
        return AlgorithmParameters.model_validate(data)


def _network_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    schema["x-kubernetes-validations"] = [
        cel(
            "has(self.bandwidthMbit) || has(self.latencyMs) || has(self.lossPercent)",
            "set at least one of bandwidthMbit, latencyMs, lossPercent",
        ),
        cel("!has(self.jitterMs) || has(self.latencyMs)", "jitterMs needs latencyMs", ".jitterMs"),
    ]


#: Round trips of ssh's connect and handshake (TCP, banners, key exchange, authentication).
SSH_HANDSHAKE_ROUND_TRIPS = 4


class NetworkConditions(ApiModel):
    """Emulated network between the workers (Linux tc on each worker pod's interface, egress: htb for the rate,
    netem for delay and loss).

    Applied by an init container with NET_ADMIN, which leaves the restricted Pod Security profile: the operator
    refuses it unless its admin allows it (MLBENCH_ALLOW_NETWORK_EMULATION). Recorded in the run's result.
    """

    model_config = ConfigDict(json_schema_extra=_network_rules)

    bandwidth_mbit: Annotated[float, Field(gt=0, le=400_000)] | None = None
    """Egress rate of each worker in Mbit/s (an htb class); unset: not limited."""
    latency_ms: Annotated[float, Field(ge=0, le=10_000)] | None = None
    """Delay added to every packet a worker sends, in milliseconds (a round trip gains twice this)."""
    jitter_ms: Annotated[float, Field(ge=0, le=10_000)] | None = None
    """Random variation of latencyMs, in milliseconds (needs latencyMs)."""
    loss_percent: Annotated[float, Field(ge=0, lt=100)] | None = None
    """Percentage of sent packets dropped at random (TCP retransmits them: the cost shows as time)."""

    def ssh_handshake_delay(self) -> int:
        """Whole seconds this delay (latency plus jitter, on either side's egress) adds to an ssh connect and
        handshake (:data:`SSH_HANDSHAKE_ROUND_TRIPS`): what ssh's ConnectTimeout and sshd's LoginGraceTime must
        allow on top (5 s of latency made every launch time out in the banner exchange)."""
        one_way = ((self.latency_ms or 0.0) + (self.jitter_ms or 0.0)) / 1000
        return math.ceil(2 * SSH_HANDSHAKE_ROUND_TRIPS * one_way)

    @model_validator(mode="after")
    def _rules(self) -> NetworkConditions:
        if self.bandwidth_mbit is None and self.latency_ms is None and self.loss_percent is None:
            raise ValueError("set at least one of bandwidthMbit, latencyMs, lossPercent")
        if self.jitter_ms is not None and self.latency_ms is None:
            raise ValueError("jitterMs: needs latencyMs")
        return self


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


class Toleration(ApiModel):
    """A core/v1 Toleration, copied to every pod of the run."""

    key: Annotated[str, Field(max_length=316)] | None = None
    """Taint key to tolerate; empty with operator Exists tolerates every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists (any value) or Equal (the value below); Kubernetes' default is Equal."""
    value: Annotated[str, Field(max_length=63)] | None = None
    """Taint value to match with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; unset tolerates all effects."""
    toleration_seconds: SafeInt | None = None
    """With effect NoExecute: seconds the pod stays bound after the taint appears; unset: forever."""


class Placement(StrEnum):
    """Where the workers go relative to each other (the scheduler decides the rest)."""

    ANY = "Any"
    """Wherever the scheduler puts them, several on one node included."""
    ONE_WORKER_PER_NODE = "OneWorkerPerNode"
    """Every worker of a world on a node of its own (required pod anti-affinity on kubernetes.io/hostname): the
    seeds' scaling environment, where every message between workers crosses the network. A run with more workers
    than fitting nodes waits Unschedulable."""
    SPREAD = "Spread"
    """Spread over nodes as evenly as they allow (topology spread, maxSkew 1, best effort)."""


class Gang(ApiModel):
    """All-or-nothing scheduling of the workers by the scheduler-plugins coscheduling plugin: a PodGroup
    (scheduling.x-k8s.io/v1alpha1) with minMember = spec.workers, and every worker naming it and its scheduler.
    The launcher is no member: it is created only once every worker is Ready."""

    schedule_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    """The PodGroup's scheduleTimeoutSeconds: how long the scheduler holds a partial gang before releasing it
    (unset: the plugin's own default)."""
    scheduler_name: Name | None = None
    """The scheduler the workers use (its profile runs coscheduling); unset: the operator's
    MLBENCH_GANG_SCHEDULER_NAME (default scheduler-plugins-scheduler)."""


class Scheduling(ApiModel):
    """Where the run's pods may go: applied to the workers, the launcher and the dataset fetch Job's pods."""

    placement: Placement | None = None
    """Where the workers go relative to each other: Any (default), OneWorkerPerNode or Spread."""

    node_selector: (
        Annotated[dict[str, Annotated[str, Field(max_length=MAX_LABEL_VALUE)]], Field(max_length=32)] | None
    ) = None
    """Node labels every pod requires (the pods' nodeSelector)."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = None
    """Taints the pods tolerate."""
    priority_class_name: Annotated[str, Field(max_length=253)] | None = None
    """PriorityClass of the pods (it must exist)."""
    gang: Gang | None = None
    """Gang-schedule the workers with the coscheduling plugin (its PodGroup CRD must be installed); unset: the
    default scheduler, one pod at a time."""


class CheckpointPolicy(ApiModel):
    """Epoch-end checkpoints, so that a gang restart continues the run instead of training from epoch 0."""

    claim_name: Name
    """The PersistentVolumeClaim (run's namespace) for the checkpoints, mounted on every worker at /checkpoints;
    rank 0 writes <namespace>/<run>-<uid>/checkpoint.mlbc there after each epoch. Writable by UID/fsGroup 1000;
    ReadWriteMany when workers may land on several nodes."""


class CleanPodPolicy(StrEnum):
    """What to delete when a run finishes (Kubeflow's meanings)."""

    RUNNING = "Running"  #: delete unfinished pods (launcher included); keep finished ones for their logs
    ALL = "All"  #: delete every pod
    NONE = "None"  #: keep every pod


#: The longest wait between two attempts after a startup deadline (runPolicy.startupBackoffSeconds doubles up to it).
STARTUP_BACKOFF_MAX_SECONDS = 3600


class RunPolicy(ApiModel):
    """Restarts, deadline and cleanup; the one part of the spec that may change after creation."""

    active_deadline_seconds: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = Field(
        default=None,
        description="Seconds from status.startTime (admission; a dataset fetch counts) until the run fails with "
        "DeadlineExceeded (1 to 2^31-1, as for a Pod). Unset: no deadline. On a run, once set it may be lowered, "
        "not raised or removed (every pod carries it).",
    )
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3
    """Gang restarts allowed, 0 to 100 (default 3): any failed pod restarts every pod; the next failure after this
    many fails the run."""
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    """Pods deleted when the run ends: Running (default: unfinished pods; finished ones kept for logs), All, or None."""
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = Field(
        default=None,
        description="Seconds after status.completionTime until the run and everything it owns is deleted "
        "(0 to 2^31-1, as for a Job). Unset: kept until deleted.",
    )
    progress_deadline_seconds: Annotated[int, Field(ge=10, le=MAX_INT32)] | None = None
    """Seconds the training step counter (status.progress.step) may stand still while Running before the run is
    marked Stalled=True with reason NoProgress and a Warning Event (default 600). The run is not stopped: use
    activeDeadlineSeconds for that. Only once a step was seen (rank 0's metrics reachable)."""
    startup_deadline_seconds: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    """Seconds from an attempt's first pod until every worker is Ready and the launcher runs (default 600).
    Past it the pods are deleted, the pods' reasons (Unschedulable, ImagePullBackOff, ...) recorded, and the run
    retried after startupBackoffSeconds (not counted against maxRestarts) or failed (StartupDeadlineExceeded)."""
    startup_retries: Annotated[int, Field(ge=0, le=100)] = 3
    """New attempts after a startup deadline passed, 0 to 100 (default 3); the next one past it fails the run."""
    startup_backoff_seconds: Annotated[int, Field(ge=0, le=STARTUP_BACKOFF_MAX_SECONDS)] = 60
    """Wait before the first new attempt after a startup deadline (default 60 s, 0 to 3600); it doubles with each
    further one, up to 3600 s (Kueue's requeuing backoff)."""


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
        self._host_network_rules()
        return self

    def _host_network_rules(self) -> None:
        if self.pod is None or not self.pod.host_network:
            return
        if self.network is not None:
            raise ValueError(f"pod.hostNetwork: {HOST_NETWORK_NOT_WITH_NETEM}")
        if self.scheduling is None or self.scheduling.placement is not Placement.ONE_WORKER_PER_NODE:
            raise ValueError(f"pod.hostNetwork: {HOST_NETWORK_ONE_PER_NODE}")


class Phase(StrEnum):
    SUSPENDED = contract.SUSPENDED  #: spec.suspend, or queued (Kueue): no pods
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


#: The phases a run never leaves (members equal their strings: ``status.get("phase") in TERMINAL`` reads the wire).
TERMINAL: tuple[Phase, ...] = (Phase.SUCCEEDED, Phase.FAILED)


class WorkerCounts(ApiModel):
    """How many worker pods exist and are Ready."""

    ready: Annotated[int, Field(ge=0)] = 0
    """Worker pods of the current attempt that are Ready (sshd answering)."""
    total: Annotated[int, Field(ge=0)] = 0
    """Worker pods the run wants (spec.workers)."""


class Progress(ApiModel):
    """Live view scraped from rank 0; best effort."""

    epoch: Annotated[Finite, Field(ge=0)] | None = None
    """Epochs done so far, fractional (2.5 = half way through the third)."""
    epoch_rounded: Annotated[str, Field(max_length=16)] | None = None
    """epoch cut to tenths (``2.3``, ``8``), the column ``kubectl get br`` shows."""
    step: Annotated[int, Field(ge=0, le=MAX_SAFE_INT)] | None = None
    """Optimizer steps done so far."""
    last_accuracy: Annotated[Finite, Field(ge=0, le=1)] | None = None
    """Accuracy (fraction) of the latest evaluation."""
    accuracy: Annotated[str, Field(max_length=16)] | None = None
    """lastAccuracy as a percentage with one decimal (``81.2%``)."""
    last_score: Annotated[Finite, Field(ge=0)] | None = None
    """The task's goal metric (goal.metric) at the latest evaluation: an accuracy as a fraction, BLEU (0 to 100),
    a perplexity or a loss. For an accuracy goal the same as lastAccuracy."""
    score: Annotated[str, Field(max_length=24)] | None = None
    """lastScore as the column ``kubectl get br`` shows it, in the metric's own form: ``81.2%``, ``24.3 BLEU``,
    ``ppl 71.2``, ``loss 0.412``."""
    samples_per_second: Annotated[Finite, Field(ge=0)] | None = None
    """Global training throughput so far: samples of all ranks per second of step time."""
    updated_at: datetime | None = None
    """When the operator last read these figures (RFC 3339)."""
    step_changed_at: datetime | None = None
    """When the step counter was last seen to move (RFC 3339); what runPolicy.progressDeadlineSeconds measures."""


class RunResult(ApiModel):
    """The final figures, copied from the launcher's termination message."""

    goal_reached: bool
    """Whether the selected target (spec.goal) was reached."""
    time_to_goal_seconds: Finite | None = None
    """Seconds from the run's start (before data loading) to the end of the evaluation that first met the target."""
    time_to_goal: Annotated[str, Field(max_length=32)] | None = None
    """timeToGoalSeconds as a duration (``6.5s``, ``4m07s``, ``1h02m09s``), the column ``kubectl get br`` shows."""
    best_accuracy: Finite | None = None
    """Best accuracy (fraction) of any evaluation."""
    final_accuracy: Finite | None = None
    """Accuracy (fraction) of the last evaluation."""
    goal_metric: GoalMetric | None = None
    """The metric the goal compares (the task's goal.metric); bestScore and finalScore are values of it."""
    best_score: Finite | None = None
    """The goal metric's best value of any evaluation (the lowest for perplexity and loss)."""
    final_score: Finite | None = None
    """The goal metric's value at the last evaluation."""
    bleu_signature: Annotated[str, Field(max_length=256)] | None = None
    """A BLEU goal: sacrebleu's signature, saying how BLEU was computed (tokenizer, smoothing, version)."""
    epochs: Finite | None = None
    """Epochs trained, fractional (steps / steps per epoch)."""
    wall_clock_seconds: Finite | None = None
    """Seconds from the run's start to its stop, evaluation and set-up included (one-time data decoding excluded)."""
    compute_seconds: Finite | None = None
    """Seconds of forward + backward + optimizer on rank 0 (with ddp, backward includes its overlapped all-reduce)."""
    communication_seconds: Finite | None = None
    """Seconds rank 0 spent in the gradient all-reduce, waiting for the slowest rank included (0 with ddp)."""
    samples_per_second: Finite | None = None
    """Global training throughput: samples of all ranks / summed step time."""
    world_size: SafeInt | None = None
    """Processes that trained (workers x slotsPerWorker)."""
    resumes: SafeInt | None = None
    """Times the run continued from its epoch-end checkpoint after a gang restart (spec.checkpoint; 0: never)."""
    bytes_per_step: SafeInt | None = None
    """Payload bytes each rank sent per step (the algorithm's declaration; status.results has the full record)."""
    compression_ratio: Finite | None = None
    """Uncompressed (allreduce-sgd) bytes per step / bytesPerStep: above 1, the algorithm sends less."""
    compression: Annotated[str, Field(max_length=16)] | None = None
    """compressionRatio with one decimal (``71.9x``), the column ``kubectl get br -o wide`` shows."""
    peak_bus_bandwidth: Annotated[dict[str, Finite], Field(max_length=8)] | None = None
    """Collectives tasks: the highest bus bandwidth in bytes per second of each operation (all-reduce, all-gather,
    broadcast) over the sizes swept, as nccl-tests defines busbw; status.results has every size."""
    image: Annotated[str, Field(max_length=512)] | None = None
    """The runner image the run asked for (spec.image or the task's runner.image)."""
    image_ids: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=8)] | None = None
    """The image digests the ranks' containers actually ran (the kubelet's imageID of every worker, deduplicated):
    what a tag pointed to at run time. More than one means the tag moved during the run."""


#: Interrupted results collections (``status.results.attempts``) after which the operator gives up.
MAX_COLLECT_ATTEMPTS = 3


class ResultsRef(ApiModel):
    """Where the run's full results (summary with history, event log, config) are kept, or why not.

    ``mlbench results <namespace>/<run>`` downloads them; the ConfigMap is owned by the run.
    """

    config_map: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="ConfigMap holding the gzip files (binaryData)."
    )
    files: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=MAX_RESULT_FILES)] | None = None
    """Keys of the ConfigMap's binaryData, e.g. summary.json.gz, events.jsonl.gz, config.json.gz."""
    compressed_bytes: Annotated[int, Field(ge=0)] | None = None
    """Total size of the kept files, gzip-compressed, in bytes."""
    truncated: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=MAX_RESULT_FILES)] | None = (
        Field(default=None, description="Files cut to fit the 1 MiB ConfigMap limit (the event log only).")
    )
    collected_at: datetime | None = None
    """When the operator wrote the ConfigMap (RFC 3339)."""
    message: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="Why no results were kept (e.g. the launcher never ran mpirun)."
    )
    failing_since: datetime | None = None
    """When reading the launcher's log (or keeping its files) first failed (RFC 3339); the operator retries
    for MLBENCH_RESULTS_WAIT_SECONDS (60 s) from then before it records why nothing was kept."""
    attempts: Annotated[int, Field(ge=0, le=MAX_COLLECT_ATTEMPTS)] | None = None
    """Collections started and not yet ended, recorded before the launcher's log is read: one that an operator
    restart interrupted counts, and after MAX_COLLECT_ATTEMPTS of them the operator gives up instead of
    reading the same log again after every restart."""


class LauncherRecord(ApiModel):
    """The launcher pod the operator created for an attempt: the UID the API server answered its create with.
    Only that pod is the run's launcher (its exit and termination message are the run's result); another pod
    of the launcher's name, even one carrying the run's ownerReference and labels, is not."""

    uid: Annotated[str, Field(min_length=1, max_length=64)]
    """The UID the API server answered the operator's launcher create with."""
    attempt: Annotated[int, Field(ge=0)]
    """The attempt (status.restarts when it was created) the launcher belongs to."""


class BenchmarkRunStatus(ApiModel):
    """What the operator observed; written only by the operator (the status subresource)."""

    phase: Phase | None = None
    """Pending (admitted; dataset, workers being created or scheduled), Starting (waiting for Ready and the
    launcher), Running (launcher running), then Succeeded or Failed. A gang restart goes back to Pending."""
    conditions: Annotated[list[Condition], Field(max_length=16)] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """DatasetReady, WorkersReady, Running, GoalReached, Succeeded, Failed and Restarted, one of each type; the
    reason of Failed is the cause (e.g. OOMKilled, TaskNotFound)."""
    observed_generation: int | None = None
    """The metadata.generation of the spec this status reflects."""
    start_time: datetime | None = None
    """When the operator admitted the run (RFC 3339); runPolicy.activeDeadlineSeconds counts from here."""
    completion_time: datetime | None = None
    """When the run succeeded or failed (RFC 3339); runPolicy.ttlSecondsAfterFinished counts from here."""
    workers: WorkerCounts | None = None
    """Worker pods ready and wanted."""
    restarts: Annotated[int, Field(ge=0)] | None = None
    """Gang restarts so far (the current attempt's number); at most runPolicy.maxRestarts plus disruptionRestarts
    plus startupTimeouts."""
    disruption_restarts: Annotated[int, Field(ge=0)] | None = None
    """Of those, the restarts a disruption caused (a drain, an eviction, a preemption, a lost node: a pod with the
    DisruptionTarget condition); they do not count against runPolicy.maxRestarts."""
    startup_timeouts: Annotated[int, Field(ge=0)] | None = None
    """Of those, the restarts after runPolicy.startupDeadlineSeconds passed (the attempt's pods released); they do
    not count against runPolicy.maxRestarts but against runPolicy.startupRetries."""
    startup_retry_at: datetime | None = None
    """When the attempt after the last startup timeout may create its pods (RFC 3339): the backoff's end."""
    progress: Progress | None = None
    """Live figures from rank 0's metrics, refreshed about every 30 s while Running; best effort."""
    result: RunResult | None = None
    """The final figures, from the launcher's termination message; set when the launcher has finished."""
    results: ResultsRef | None = None
    """Where the full results are kept (ConfigMap <run>-results), or why they are not."""
    launcher: LauncherRecord | None = None
    """The launcher the operator created for the current (or last) attempt."""
    message: Annotated[str, Field(max_length=32768)] | None = None
    """One line for humans: what the run is doing or why it failed."""
    task_snapshot: BenchmarkTaskSpec | None = None
    """The task's spec as copied at admission; the run (gang restarts included) uses it, not later task edits."""


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
