"""The pod contract between the operator, the runner and the user's tools: environment variables, paths in the
containers, ports, the SSH Secret's keys, and the condition types and reasons of a BenchmarkRun's status.

Here, in the API package, because every side ships it: the operator image, the runner image (Dockerfile.runner
copies crds/mlbench_api) and the ``mlbench`` CLI. The operator sets these (mlbench_operator.runpods), the
runner reads them (mlbench_runner.pod.launch, .world, .worker, .fetch), ``mlbench validate`` names the reasons the
operator would give; nobody restates them (tests/test_architecture.py looks for the literals).
"""

from __future__ import annotations

from enum import StrEnum, unique

from mlbench_api.datasets import FetchReason

# -- ports ---------------------------------------------------------------------------------------------------
#: The workers' sshd (unprivileged: the runner runs as a non-root user); mpirun's ssh connects to it.
SSH_PORT = 2222
#: Rank 0 of a worker serves Prometheus metrics here, rank r on ``METRICS_PORT + local rank`` (RunConfig.metricsPort).
METRICS_PORT = 9400
#: Default of ``MLBENCH_METRICS_LINGER_SECONDS``: three scrapes at the PodMonitor's 15 s, one at a 30 s default.
METRICS_LINGER_SECONDS = 45

# -- paths in the containers --------------------------------------------------------------------------------
#: The run's ConfigMap: ``config.json`` (the RunConfig) and ``hostfile`` (mpirun's).
CONFIG_DIR = "/etc/mlbench"
CONFIG_FILE = "config.json"
HOSTFILE = "hostfile"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
HOSTFILE_PATH = f"{CONFIG_DIR}/{HOSTFILE}"
#: The run's SSH Secret (its keys below).
SSH_DIR = "/etc/mlbench-ssh"
#: The ranks' output (summary, events); an emptyDir.
OUTPUT_DIR = "/tmp/mlbench"
#: Where sshd (workers) and ssh (launcher, mpirun's tree spawn) keep their private copies of the run's keys: one
#: path in every pod, a memory-backed emptyDir (the private keys never touch the node's disk).
SSH_SCRATCH_DIR = "/tmp/mlbench-sshd"
#: The namespace's dataset volume (sourced datasets live under it; a task's dataset.path must too).
DATA_DIR = "/data"
#: Where a run with ``spec.checkpoint`` mounts its checkpoint volume (the claim it names), on every worker.
CHECKPOINT_DIR = "/checkpoints"
#: Where a container's last words go (the pod's terminationMessagePath): the launcher's result, a failure.
TERMINATION_LOG = "/dev/termination-log"


def checkpoint_dir(namespace: str, run: str, uid: str) -> str:
    """The run's own folder in the checkpoint volume (RunConfig.checkpointDir): by its UID, so a new run of the
    same name starts afresh and never meets an older run's checkpoint by accident."""
    return f"{CHECKPOINT_DIR}/{namespace}/{run}-{uid}"


# -- environment of the runner's containers ------------------------------------------------------------------
ENV_CONFIG = "MLBENCH_RUN_CONFIG"  #: the RunConfig file (CONFIG_PATH in a pod)
ENV_HOSTFILE = "MLBENCH_HOSTFILE"  #: mpirun's hostfile (HOSTFILE_PATH in a pod)
ENV_SSH_DIR = "MLBENCH_SSH_DIR"
ENV_SSH_PORT = "MLBENCH_SSH_PORT"
ENV_SSH_KEY = "MLBENCH_SSH_KEY"  #: the client's private key
ENV_SSH_KNOWN_HOSTS = "MLBENCH_SSH_KNOWN_HOSTS"  #: the run's host key, under its alias
ENV_SSH_HOST_KEY_ALIAS = "MLBENCH_SSH_HOST_KEY_ALIAS"
ENV_RUN = "MLBENCH_RUN"  #: the BenchmarkRun's name
ENV_ROLE = "MLBENCH_ROLE"  #: worker or launcher
ENV_WORKER_INDEX = "MLBENCH_WORKER_INDEX"
ENV_METRICS_LINGER_SECONDS = "MLBENCH_METRICS_LINGER_SECONDS"
ENV_TERMINATION_LOG = "MLBENCH_TERMINATION_LOG"  #: outside a pod: where the launcher writes its result
ENV_DATA_DIR = "MLBENCH_DATA_DIR"  #: a fallback directory for a dataset path that does not exist
#: the Kubernetes node of a rank's pod (the downward API's spec.nodeName; sshd passes it on to the ranks' sessions)
ENV_NODE_NAME = "MLBENCH_NODE_NAME"
#: the names (comma-separated) of the run's own variables (``spec.pod.env``) that the launcher forwards to every
#: rank (``mpirun -x``): the ranks start under sshd, whose sessions do not inherit the container's environment
ENV_FORWARD_ENV = "MLBENCH_FORWARD_ENV"
#: Every variable of this contract starts so; a run's ``spec.pod.env`` may set none of them.
ENV_PREFIX = "MLBENCH_"
#: Variables besides ``MLBENCH_*`` that the pods or the ranks' world rely on (the pod's own name, the rendezvous,
#: the ranks' identities that torch.distributed and Open MPI set): a run's ``spec.pod.env`` may not set them.
RESERVED_ENV = ("POD_NAME", "HOSTNAME", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
#: Prefixes of the variables Open MPI sets for every rank (its rank, size, local rank): not a run's to set.
RESERVED_ENV_PREFIXES = (ENV_PREFIX, "OMPI_COMM_WORLD_", "PMIX_")

# -- keys of the run's SSH Secret (type kubernetes.io/ssh-auth, which requires ``ssh-privatekey``) ------------
#: The client's private key (launcher; workers too, for mpirun's tree spawn).
SSH_PRIVATE_KEY = "ssh-privatekey"
#: ``restrict <client public key>``: the only key every worker's sshd lets in.
SSH_AUTHORIZED_KEYS = "authorized_keys"
#: The run's host key: every worker's sshd presents it (``-h``).
SSH_HOST_KEY = "ssh_host_ed25519_key"
#: ``<host key alias> <host public key>``: the only host key the client accepts.
SSH_KNOWN_HOSTS = "known_hosts"

#: The user the runner image runs as (non-root; sshd listens on an unprivileged port).
RUNNER_UID = 1000

# Condition types, in the order ``kubectl describe`` shows them.
SUSPENDED = "Suspended"  #: True while spec.suspend holds or a queue (Kueue) has not admitted the run: no pods
DATASET_READY = "DatasetReady"  #: only on runs whose task has a dataset.source
WORKERS_READY = "WorkersReady"
RUNNING = "Running"
GOAL_REACHED = "GoalReached"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
RESTARTED = "Restarted"  #: True after a gang restart, with the cause
# kstatus (sigs.k8s.io/cli-utils) conditions, which Flux, Argo CD and ``kubectl wait`` read generically.
READY = "Ready"  #: True once the run Succeeded; False with the phase (or the failure) as the reason
RECONCILING = "Reconciling"  #: True while the run is Pending, Starting or Running
STALLED = "Stalled"  #: True when the run Failed, or Running with a step counter that stopped moving
TYPES = (
    SUSPENDED,
    DATASET_READY,
    WORKERS_READY,
    RUNNING,
    GOAL_REACHED,
    SUCCEEDED,
    FAILED,
    RESTARTED,
    READY,
    RECONCILING,
    STALLED,
)


@unique
class Reason(StrEnum):
    """Every condition reason of a BenchmarkRun (the dataset's are :class:`DatasetReason`).

    Members compare equal to their strings, so the status JSON is what it was with string literals.
    The kstatus conditions and ``Failed=False`` of a succeeded run use the phase as their reason
    (``mlbench_api.runstatus.Phase``); those are not repeated here. docs/operator.md lists every member
    (tests/operator/test_conditions.py keeps the two in step).
    """

    # -- Suspended (also WorkersReady and Running False while it holds) ----------------------------------------
    SUSPENDED = "Suspended"  #: True: spec.suspend is true; the run's pods are deleted, none is created
    #: True: the run's Kueue Workload waits for admission (Kueue's message: quota, a missing queue, too big)
    QUEUED = "Queued"
    ADMITTED = "Admitted"  #: False: Kueue admitted the run's Workload; its flavors' node labels go on the pods
    #: True (also WorkersReady and Running False): Kueue evicted the run's Workload because its pods were not all
    #: Ready within waitForPodsReady.timeout; the pods are released, the quota given back, Kueue requeues it
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    RESUMED = "Resumed"  #: False: spec.suspend was set back to false; the run starts a new attempt
    # -- WorkersReady ------------------------------------------------------------------------------------------
    CREATING = "Creating"  #: False: just admitted, the first workers are being created
    WAITING_FOR_DATASET = "WaitingForDataset"  #: False: the dataset is fetched first (no worker exists yet)
    #: WorkersReady False: workers exist but not all are Ready; Running False: the launcher waits for them
    WAITING_FOR_WORKERS = "WaitingForWorkers"
    ALL_WORKERS_READY = "AllWorkersReady"  #: True: every worker of the current attempt is Ready
    UNSCHEDULABLE = "Unschedulable"  #: False: the scheduler cannot place a worker (its message is shown)
    CONTAINER_WAITING = "ContainerWaiting"  #: False: a worker's container is stuck waiting (ImagePullBackOff...)
    #: False: a worker's volume cannot be mounted (the kubelet's Event, e.g. a missing ConfigMap or Secret)
    FAILED_MOUNT = "FailedMount"
    #: False: a worker's volume cannot be attached to its node (e.g. a ReadWriteOnce claim attached elsewhere)
    FAILED_ATTACH_VOLUME = "FailedAttachVolume"
    #: WorkersReady/Running False while the API server refuses a create (403: quota, webhook; retried);
    #: Failed: a 422
    CREATE_FAILED = "CreateFailed"
    #: WorkersReady/Running False: a pod, Service, ConfigMap or Secret with the run's name has another owner
    #: (DatasetReady False: the dataset volume or the fetch Job, :attr:`DatasetReason.NAME_CONFLICT`); Failed: the
    #: operator's create of the launcher was answered 409 by a pod with the run's marks that it did not create
    NAME_CONFLICT = "NameConflict"
    RESTARTING = "Restarting"  #: WorkersReady/Running False during a gang restart (also its Event)
    #: WorkersReady/Running False after the startup deadline released the attempt's pods, until the next attempt
    #: (its message: the pods' own reasons, the backoff); also Restarted's reason, the Event's and Failed's once
    #: runPolicy.startupRetries are spent
    STARTUP_DEADLINE_EXCEEDED = "StartupDeadlineExceeded"
    RUN_FINISHED = "RunFinished"  #: WorkersReady False once the run succeeded (workers no longer needed)
    #: WorkersReady, Running and GoalReached False once the run failed (Failed names the cause)
    RUN_FAILED = "RunFailed"
    # -- Running -----------------------------------------------------------------------------------------------
    CREATING_LAUNCHER = "CreatingLauncher"  #: False: every worker is Ready, the launcher is being created
    LAUNCHER_STARTING = "LauncherStarting"  #: False: the launcher exists but is not Running yet
    LAUNCHER_RUNNING = "LauncherRunning"  #: True: the launcher runs mpirun
    COMPLETED = "Completed"  #: False: the launcher exited 0 (the run succeeded)
    # -- GoalReached, Succeeded, Failed ------------------------------------------------------------------------
    NO_RESULT_YET = "NoResultYet"  #: GoalReached Unknown until the run finishes
    IN_PROGRESS = "InProgress"  #: Succeeded and Failed False while the run has not finished
    GOAL_REACHED = "GoalReached"  #: GoalReached and Succeeded True: the summary says the goal was reached
    GOAL_NOT_REACHED = "GoalNotReached"  #: GoalReached False, Succeeded True: finished without the goal
    #: the summary's status is "aborted" (e.g. diverged): GoalReached False, and Failed True when the
    #: launcher failed with it (never restarted) or Succeeded True when it exited 0
    ABORTED = "Aborted"
    # -- Stalled (kstatus) -------------------------------------------------------------------------------------
    NO_PROGRESS = "NoProgress"  #: True while Running: the step counter has not moved for progressDeadlineSeconds
    # -- Failed: admission (nothing was created) ---------------------------------------------------------------
    INVALID_SPEC = "InvalidSpec"  #: the run's spec does not validate
    TASK_NOT_FOUND = "TaskNotFound"  #: spec.taskRef names no BenchmarkTask
    INVALID_TASK = "InvalidTask"  #: the BenchmarkTask does not validate
    OVERRIDE_NOT_ALLOWED = "OverrideNotAllowed"  #: a closed-division override the task does not list
    ALGORITHM_NOT_ALLOWED = "AlgorithmNotAllowed"  #: a closed-division run's algorithm the task does not list
    #: the effective configuration is invalid (also when it can no longer be rebuilt after admission)
    INVALID_CONFIG = "InvalidConfig"
    #: the admin's admission policy refuses the run, or Pod Security admission its pods (the namespace's level)
    POLICY_VIOLATION = "PolicyViolation"
    # -- Failed (or Restarted): the run's pods -----------------------------------------------------------------
    INVALID_INPUT = "InvalidInput"  #: the runner refused its input (exit code 2): never restarted
    WORKER_FAILED = "WorkerFailed"  #: a worker failed (non-zero exit, no more specific cause)
    LAUNCHER_FAILED = "LauncherFailed"  #: the launcher failed and no worker reported a cause
    OOM_KILLED = "OOMKilled"  #: a pod, or a rank inside a worker, was killed for its memory limit
    EVICTED = "Evicted"  #: the kubelet evicted a pod (node pressure)
    #: a pod exceeded its own activeDeadlineSeconds, or the run its runPolicy.activeDeadlineSeconds
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    WORKER_LOST = "WorkerLost"  #: a worker disappeared (or is Terminating) while the launcher ran
    #: a pod of the world was disrupted (DisruptionTarget: drain, eviction, preemption, taint): a restart not counted
    DISRUPTED = "Disrupted"
    LAUNCHER_LOST = "LauncherLost"  #: the launcher disappeared while it was running
    WORKER_EXITED = "WorkerExited"  #: a worker exited 0 before the launcher finished
    #: the launcher's result is unusable, or the API server refused (422) to store the status
    INVALID_RESULT = "InvalidResult"
    #: Kueue deactivated the run's Workload (spec.active false: waitForPodsReady's requeuing backoffLimitCount
    #: spent, or an admin): it is never admitted again; Kueue's message, the run's unfinished pods deleted
    WORKLOAD_DEACTIVATED = "WorkloadDeactivated"


class DatasetReason(StrEnum):
    """Reasons of ``DatasetReady`` (and of ``Failed`` when a fetch fails)."""

    FETCHING = "Fetching"  #: False: the fetch Job is being created, runs, or retries
    FETCHED = "Fetched"  #: True: the verified data is in the dataset volume
    SOURCE_UNREACHABLE = FetchReason.SOURCE_UNREACHABLE.value
    CHECKSUM_MISMATCH = FetchReason.CHECKSUM_MISMATCH.value
    VOLUME_FULL = FetchReason.VOLUME_FULL.value
    FETCH_FAILED = FetchReason.FETCH_FAILED.value
    #: False: the dataset volume (PVC) or the fetch Job's name is held by an object the operator did not create
    #: (a PVC: not its labels; a Job: not its labels, checksum annotations, image, command and volumes): never
    #: used, adopted or deleted; the run waits and says why
    NAME_CONFLICT = Reason.NAME_CONFLICT.value
