"""The run's status vocabulary (condition types and reasons) and ``metav1.Condition`` bookkeeping.

Every reason the operator writes is a member of :class:`Reason` (or :class:`DatasetReason`), so the
set is stated once, documented next to its use, and checked against docs/operator.md by a test.
``lastTransitionTime`` moves only when a condition's status flips.

Two forms of the same bookkeeping: :func:`put`, :func:`find` and :func:`holds` on typed conditions
(``mlbench_api.common.Condition``), which the BenchmarkRun's status is built from, and
:func:`set_condition`, :func:`get` and :func:`is_true` on the wire's dicts (a BenchmarkSweep's status,
and readers of a stored status).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum, unique
from typing import Any, Literal

from mlbench_api.common import Condition as ConditionModel
from mlbench_api.datasets import FetchReason

#: A condition as the wire carries it (``metav1.Condition`` in JSON); :class:`ConditionModel` is the typed one.
Condition = dict[str, Any]
#: ``Condition.status``.
ConditionStatus = Literal["True", "False", "Unknown"]
#: ``Condition.message`` and ``status.message``: the CRD's maxLength.
MAX_MESSAGE = 32768

# Condition types, in the order ``kubectl describe`` shows them.
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
TYPES = (DATASET_READY, WORKERS_READY, RUNNING, GOAL_REACHED, SUCCEEDED, FAILED, RESTARTED, READY, RECONCILING, STALLED)
_ORDER = {t: i for i, t in enumerate(TYPES)}


def order(type_: str) -> int:
    """Sort key of a condition type: :data:`TYPES` first, in that order, then any other type."""
    return _ORDER.get(type_, len(_ORDER))


@unique
class Reason(StrEnum):
    """Every condition reason of a BenchmarkRun (the dataset's are :class:`DatasetReason`).

    Members compare equal to their strings, so the status JSON is what it was with string literals.
    The kstatus conditions and ``Failed=False`` of a succeeded run use the phase as their reason
    (``mlbench_api.run.Phase``); those are not repeated here. docs/operator.md lists every member
    (tests/operator/test_conditions.py keeps the two in step).
    """

    # -- WorkersReady ------------------------------------------------------------------------------------------
    CREATING = "Creating"  #: False: just admitted, the first workers are being created
    WAITING_FOR_DATASET = "WaitingForDataset"  #: False: the dataset is fetched first (no worker exists yet)
    #: WorkersReady False: workers exist but not all are Ready; Running False: the launcher waits for them
    WAITING_FOR_WORKERS = "WaitingForWorkers"
    ALL_WORKERS_READY = "AllWorkersReady"  #: True: every worker of the current attempt is Ready
    UNSCHEDULABLE = "Unschedulable"  #: False: the scheduler cannot place a worker (its message is shown)
    CONTAINER_WAITING = "ContainerWaiting"  #: False: a worker's container is stuck waiting (ImagePullBackOff...)
    #: WorkersReady/Running False while the API server refuses a create (403: quota, webhook; retried);
    #: Failed: a 422
    CREATE_FAILED = "CreateFailed"
    #: WorkersReady/Running False: a pod, Service, ConfigMap or Secret with the run's name has another owner
    NAME_CONFLICT = "NameConflict"
    RESTARTING = "Restarting"  #: WorkersReady/Running False during a gang restart (also its Event)
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


class DatasetReason(StrEnum):
    """Reasons of ``DatasetReady`` (and of ``Failed`` when a fetch fails)."""

    FETCHING = "Fetching"  #: False: the fetch Job is being created, runs, or retries
    FETCHED = "Fetched"  #: True: the verified data is in the dataset volume
    SOURCE_UNREACHABLE = FetchReason.SOURCE_UNREACHABLE.value
    CHECKSUM_MISMATCH = FetchReason.CHECKSUM_MISMATCH.value
    VOLUME_FULL = FetchReason.VOLUME_FULL.value
    FETCH_FAILED = FetchReason.FETCH_FAILED.value


#: The name tests/operator/test_datasets.py reads WorkersReady's dataset-wait reason by.
WAITING_FOR_DATASET = Reason.WAITING_FOR_DATASET


#: C0/C1 control characters except tab and newline: terminal escapes from a pod's output must not
#: reach ``kubectl describe`` (a tenant's log line could rewrite another user's terminal).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """Text copied from pods (termination messages, logs) made safe for status, conditions and Events."""
    return _CONTROL.sub("", text)


def stored_text(text: str) -> str:
    """A condition's or the status' message as stored: cleaned, at most :data:`MAX_MESSAGE` characters."""
    return clean(text)[:MAX_MESSAGE]


def instant(now: datetime) -> datetime:
    """``now`` as Kubernetes stores a time: in UTC, to the second (a naive ``now`` is local time)."""
    return now.astimezone(UTC).replace(microsecond=0)


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes it."""
    return instant(now).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# -- typed conditions (the BenchmarkRun's status) -----------------------------------------------------------------
def find(conditions: Iterable[ConditionModel] | None, type_: str) -> ConditionModel | None:
    return next((c for c in conditions or () if c.type == type_), None)


def holds(conditions: Iterable[ConditionModel] | None, type_: str) -> bool:
    """Whether the condition ``type_`` is there with status True."""
    cond = find(conditions, type_)
    return cond is not None and cond.status == "True"


def put(
    conditions: Iterable[ConditionModel],
    type_: str,
    status: ConditionStatus,
    reason: str,
    text: str,
    *,
    now: datetime,
    generation: int | None = None,
) -> list[ConditionModel]:
    """A new list with ``type_`` set (sorted by :func:`order`); the old lastTransitionTime is kept while
    the status stays the same. ``reason`` is a :class:`Reason`, :class:`DatasetReason` or phase member
    (stored as its plain string), or a reason echoed from the stored status."""
    conditions = list(conditions)
    old = find(conditions, type_)
    fields: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": str(reason),
        "message": stored_text(text),
        "last_transition_time": old.last_transition_time if old is not None and old.status == status else instant(now),
    }
    if generation is not None:  # no observedGeneration key at all without one, as before
        fields["observed_generation"] = generation
    new = ConditionModel(**fields)
    out = [new if c.type == type_ else c for c in conditions]
    if old is None:
        out.append(new)
    return sorted(out, key=lambda c: order(c.type))


# -- the wire's dicts (a BenchmarkSweep's status; readers of a stored status) -------------------------------------
def get(conditions: list[Condition] | None, type_: str) -> Condition | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[Condition] | None, type_: str) -> bool:
    cond = get(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    now: datetime,
    generation: int | None = None,
) -> list[Condition]:
    """Return a new list with ``type_`` set; keeps the old lastTransitionTime if status is unchanged
    (:func:`put` on dicts)."""
    old = get(conditions, type_)
    new: Condition = {
        "type": type_,
        "status": status,
        "reason": str(reason),  # a plain string in the stored status, also for a Reason or Phase member
        "message": clean(message)[:MAX_MESSAGE],
        "lastTransitionTime": (
            old["lastTransitionTime"]
            if old is not None and old.get("status") == status and old.get("lastTransitionTime")
            else timestamp(now)
        ),
    }
    if generation is not None:
        new["observedGeneration"] = generation
    out = [c if c.get("type") != type_ else new for c in conditions]
    if old is None:
        out.append(new)
    return sorted(out, key=lambda c: order(c.get("type", "")))
