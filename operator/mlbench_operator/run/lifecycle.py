"""A run's lifecycle around its pods: cleanup, deadlines, the TTL, refused creates, name conflicts, the dataset's
wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from mlbench_api.common import MAX_INT32
from mlbench_api.runpolicy import CleanPodPolicy, RunPolicy
from mlbench_api.runstatus import TERMINAL, Phase, WorkerCounts
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import DatasetReason, Reason
from mlbench_operator.datasets import FetchAction, FetchState
from mlbench_operator.podview import PodView
from mlbench_operator.run.ownership import conflict_text
from mlbench_operator.run.status import Plan, _spec_workers, _Status

#: A pod still Terminating this long after its deletionTimestamp (the end of its grace period) is on
#: a lost node: the kubelet will never confirm, so it is force-deleted (its name is needed again).
FORCE_DELETE_AFTER_SECONDS = 60.0


#: Appended to WorkersReady's message once the end-of-run cleanup is done (a real status change).
CLEANED_UP = "pods cleaned up per cleanPodPolicy"


def clean_pod_policy(spec: Mapping[str, Any] | None) -> CleanPodPolicy:
    """``spec.runPolicy.cleanPodPolicy`` from the raw spec (usable even when the spec no longer validates)."""
    raw = ((spec or {}).get("runPolicy") or {}).get("cleanPodPolicy")
    try:
        return CleanPodPolicy(raw) if raw else RunPolicy().clean_pod_policy
    except ValueError:
        return RunPolicy().clean_pod_policy


def end_policy(body: Mapping[str, Any]) -> CleanPodPolicy:
    """The cleanPodPolicy a finished run is cleaned up by: its own, except that a run failed by its startup
    deadline releases every unfinished pod even under None (nothing holds a node or a GPU forever for a world
    that never started; finished pods keep their logs)."""
    policy = clean_pod_policy(body.get("spec"))
    failed = c.get((body.get("status") or {}).get("conditions"), c.FAILED) or {}
    if policy is CleanPodPolicy.NONE and failed.get("reason") == Reason.STARTUP_DEADLINE_EXCEEDED:
        return CleanPodPolicy.RUNNING
    return policy


def _cleanup(policy: CleanPodPolicy, pods: Iterable[PodView]) -> list[str]:
    """Pods to delete at the end. Running (as Kubeflow's): every pod that has not finished, the launcher
    included (a Pending launcher would otherwise wait forever); finished pods stay for their logs."""
    if policy is CleanPodPolicy.NONE:
        return []
    out = []
    for pod in pods:
        if pod.terminating:
            continue
        if policy is CleanPodPolicy.ALL or not pod.finished:
            out.append(pod.name)
    return sorted(out)


def _own(pods: Iterable[PodView], uid: str) -> tuple[list[PodView], list[PodView]]:
    """(pods of this run, pods with our labels but another or no controller: e.g. a deleted run of the same
    name whose garbage collection has not finished)."""
    mine: list[PodView] = []
    foreign: list[PodView] = []
    for pod in pods:
        # no controller at all (e.g. orphaned with --cascade=orphan) is not ours either
        (foreign if uid and pod.owner_uid != uid else mine).append(pod)
    return mine, foreign


def rank0(pods: Iterable[PodView], uid: str, attempt: int) -> PodView | None:
    """The worker whose metrics feed ``status.progress``: rank 0 of the current attempt, this run's own (the
    planner's rule, :func:`_own`), with an IP. Not a foreign pod with the run's labels (a deleted run of the
    same name), nor the previous attempt's rank 0 still terminating after a gang restart."""
    mine, _ = _own(pods, uid)
    return next(
        (
            p
            for p in mine
            if p.role == n.ROLE_WORKER and p.rank == 0 and p.attempt == attempt and p.ip and not p.terminating
        ),
        None,
    )


def cleanup_pending(body: Mapping[str, Any], pods: Iterable[PodView]) -> list[str]:
    """A finished run's pods that its cleanPodPolicy still wants deleted (empty: cleanup done).

    Derived from the cluster alone (terminal phase + pods present), so a cleanup interrupted by an
    operator restart or a failed delete is re-driven until done.
    """
    uid = (body.get("metadata") or {}).get("uid", "")
    mine, _ = _own(pods, uid)
    return _cleanup(end_policy(body), mine)


def cleanup_unrecorded(body: Mapping[str, Any], pods: Iterable[PodView]) -> bool:
    """A finished run whose cleanup deleted its pods but whose status does not say so (the operator stopped
    between the deletes and the status write): its ``workers.ready`` would keep the count from before, and no
    daemon would come back for it (nothing is left to delete). The policy cleans, WorkersReady does not say
    :data:`CLEANED_UP`, and a pod of the run is going or ``workers.ready`` counts more workers than are ready
    (under ``Running`` the finished launcher stays: its pods are not all gone)."""
    status = body.get("status") or {}
    policy = end_policy(body)
    if status.get("phase") not in TERMINAL or policy is CleanPodPolicy.NONE:
        return False
    wr = c.get(status.get("conditions"), c.WORKERS_READY) or {}
    if CLEANED_UP in (wr.get("message") or ""):
        return False
    mine, _ = _own(pods, (body.get("metadata") or {}).get("uid", ""))
    if _cleanup(policy, mine):  # still to delete: cleanup_pending's case
        return False
    ready = int((status.get("workers") or {}).get("ready") or 0)
    return any(p.terminating for p in mine) or ready > _ready_workers(mine, int(status.get("restarts") or 0))


def _ready_workers(mine: Iterable[PodView], restarts: int) -> int:
    """The run's Ready workers of its current attempt (Terminating ones not counted)."""
    return sum(1 for p in mine if p.role == n.ROLE_WORKER and p.attempt == restarts and p.ready and not p.terminating)


def cleaned_up_status(body: Mapping[str, Any], pods: Iterable[PodView], now: datetime) -> dict[str, Any]:
    """A finished run's status once its cleanup is done: ``workers.ready`` recounted, WorkersReady says so.

    A real change after a cleanup (the message gains :data:`CLEANED_UP`, or names a policy edited since the
    last cleanup), so the run gets a watch event after the daemon stopped and kopf can release the finalizer.
    """
    st = _Status.of(body, now)
    uid = (body.get("metadata") or {}).get("uid", "")
    mine, _ = _own(pods, uid)
    ready = _ready_workers(mine, st.old.restarts or 0)
    total = (st.old.workers.total if st.old.workers is not None else 0) or _spec_workers(body, 0)
    st.new.workers = WorkerCounts(ready=ready, total=total)
    wr = c.find(st.new.conditions, c.WORKERS_READY)
    msg = (wr.message if wr is not None else "") or "the run finished"
    # the policy in force now: one edited after a first cleanup (Running, then All) cleans again, and says so
    msg = f"{msg.split(f'; {CLEANED_UP}', 1)[0]}; {CLEANED_UP} {clean_pod_policy(body.get('spec')).value}"
    st.cond(c.WORKERS_READY, "False", wr.reason if wr is not None else Reason.RUN_FINISHED, msg)
    return st.dump()


def _deletable(pods: Iterable[PodView]) -> dict[str, str]:
    """name -> UID of the pods not yet terminating (a pod without a UID, in tests only, maps to "")."""
    return {p.name: p.uid or "" for p in sorted(pods, key=lambda p: p.name) if not p.terminating}


def _stuck_terminating(pod: PodView, now: datetime) -> bool:
    """Terminating for longer than its grace period plus a margin: the node is gone."""
    end = c.parse_time(pod.deletion_timestamp) if pod.terminating else None
    return end is not None and (now - end).total_seconds() > FORCE_DELETE_AFTER_SECONDS


def _until_stuck(pod: PodView, now: datetime) -> float | None:
    end = c.parse_time(pod.deletion_timestamp)
    return None if end is None else max((end - now).total_seconds() + FORCE_DELETE_AFTER_SECONDS + 1, 1.0)


def _deadline_left(body: Mapping[str, Any], start: datetime | None, now: datetime) -> float | None:
    """Seconds until ``runPolicy.activeDeadlineSeconds`` from ``start`` (negative: past it); None: no deadline."""
    deadline = ((body.get("spec") or {}).get("runPolicy") or {}).get("activeDeadlineSeconds")
    return (start + _seconds(deadline) - now).total_seconds() if deadline and start else None


def deadline_left(body: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds until the run's ``activeDeadlineSeconds`` from its ``startTime`` (negative: past); None: none."""
    return _deadline_left(body, c.parse_time((body.get("status") or {}).get("startTime")), now)


def by_deadline(delay: float | None, left: float | None) -> float | None:
    """A pass's wait, no longer than what is left of the deadline (a held run is woken when it passes)."""
    if delay is None or left is None:
        return delay
    return min(delay, max(left, 0.0))


def deadline_while(body: Mapping[str, Any], now: datetime, doing: str) -> Plan | None:
    """``Failed``/``DeadlineExceeded`` once ``activeDeadlineSeconds`` has passed while the run is held before its
    pods (``doing``: its dataset being fetched, its objects' names held by another owner, their creates refused),
    where :func:`plan`, whose :func:`deadline_exceeded` decides it otherwise, is never reached; None: not past it.
    """
    st = _Status.of(body, now)
    left = _deadline_left(body, st.old.start_time, now)
    if left is None or left > 0:
        return None
    deadline = body["spec"]["runPolicy"]["activeDeadlineSeconds"]
    message = f"the run exceeded runPolicy.activeDeadlineSeconds={deadline} while {doing}"
    st.fail(Reason.DEADLINE_EXCEEDED, message)
    return Plan(status=st.dump(), events=[("Warning", Phase.FAILED, message)])


def dataset_plan(body: Mapping[str, Any], state: FetchState, now: datetime) -> Plan:
    """Status while the run's dataset is fetched (no worker exists yet), once it is there, or when it failed.

    DatasetReady carries the state; an Event is planned only when that condition changes (not for every
    retry-count update of the message).
    """
    if state.action not in (FetchAction.READY, FetchAction.FAIL):
        ended = deadline_while(body, now, state.message)
        if ended is not None:
            return ended
    st = _Status.of(body, now)
    left = _deadline_left(body, st.old.start_time, now)
    if state.action is FetchAction.READY:
        st.cond(c.DATASET_READY, "True", state.reason, state.message)
    elif state.action is FetchAction.FAIL:
        st.cond(c.DATASET_READY, "False", state.reason, state.message)
        st.fail(state.reason, state.message)
    else:
        st.new.phase = Phase.PENDING
        st.cond(c.DATASET_READY, "False", state.reason, state.message)
        st.cond(c.WORKERS_READY, "False", Reason.WAITING_FOR_DATASET, "workers are created once the dataset is ready")
        st.cond(c.RUNNING, "False", Reason.WAITING_FOR_WORKERS, "the launcher starts once every worker is Ready")
        st.in_progress()
        st.say(state.message)
    out = Plan(status=st.dump(), requeue_after=left)
    if st.changed(c.DATASET_READY):
        warn = state.action is FetchAction.FAIL or state.reason is DatasetReason.NAME_CONFLICT
        kind = "Warning" if warn else "Normal"
        out.events.append((kind, state.reason.value, state.message))
    return out


def ttl_expired(status: Mapping[str, Any], ttl: int | None, now: datetime) -> float | None:
    """Seconds until a finished run should be deleted (<= 0: now); None: keep it."""
    done = c.parse_time(status.get("completionTime"))
    if ttl is None or done is None:
        return None
    return (done + _seconds(ttl) - now).total_seconds()


def _seconds(value: float) -> timedelta:
    """A duration from a spec field, bounded like the CRD (int32): a run stored before the bound
    existed (e.g. 1e14) must not raise OverflowError on every pass."""
    return timedelta(seconds=min(float(value), float(MAX_INT32)))


def creation_failed(body: Mapping[str, Any], failures: list[tuple[str, int, str]], now: datetime) -> Plan:
    """The API server refused creations: ``failures`` = (what, HTTP status, its message), what being
    ``pod <name>`` or ``<Kind> <name>`` (the run's Service, ConfigMap or Secret).

    What each refusal means is :func:`refusal_is_final`'s: a final one fails the run; anything else (403
    from a ResourceQuota or a webhook: may pass later) is shown as CreateFailed on WorkersReady (or
    Running, for the launcher) while the caller retries with backoff. A Warning Event is planned
    whenever the message changes, not on every retry.
    """
    st = _Status.of(body, now)
    name, code, detail = next((f for f in failures if refusal_is_final(f[1], f[2])), failures[0])
    text = f"creating {name} was refused (HTTP {code}): {detail}"
    if len(failures) > 1:
        text += f" (and {len(failures) - 1} more)"
    reason = refusal_is_final(code, detail)
    if reason is not None:
        st.fail(reason, text)
        return Plan(status=st.dump(), events=[("Warning", Phase.FAILED, text)])
    type_ = refusal_condition(name)
    st.cond(type_, "False", Reason.CREATE_FAILED, text)
    st.say(text)
    # the stored message against the one set now (both cleaned): the same refusal again plans no Event
    changed = st.changed(type_, message=True)
    return Plan(status=st.dump(), events=[("Warning", Reason.CREATE_FAILED, text)] if changed else [])


#: How Pod Security admission words its refusal (k8s.io/pod-security-admission: ``pods "x" is forbidden:
#: violates PodSecurity "restricted:latest": ...``).
POD_SECURITY_REFUSAL = "violates PodSecurity"


def refusal_is_final(code: int, detail: str) -> Reason | None:
    """The reason a refused create fails the run with, or None when a retry may pass.

    - 422: the object is invalid and never will be accepted (``CreateFailed``);
    - 403 from Pod Security admission: the namespace's ``pod-security.kubernetes.io/enforce`` level refuses
      what the task and the run ask for (an ``nfs`` or ``hostPath`` dataset volume, ``spec.network``'s
      NET_ADMIN init container, ``MLBENCH_RUNNER_UID=image``): every retry builds the same pod, so the
      run fails at once (``PolicyViolation``, the refusal's text naming the field) instead of retrying
      until its deadline;
    - any other 403 (a ResourceQuota, a webhook) may pass once something else changes: retried.
    """
    if code == 422:
        return Reason.CREATE_FAILED
    if code == 403 and POD_SECURITY_REFUSAL in detail:
        return Reason.POLICY_VIOLATION
    return None


def refusal_condition(what: str) -> str:
    """The condition a refused create (``"<Kind> <name>"`` or ``"pod <name>"``) is shown on: ``Running`` for
    what comes with the launcher (its pod, and the headless Service created right before it once every
    worker is Ready), where :func:`make_progress` keeps it while the launcher is still to be created;
    ``WorkersReady`` for the rest, which would say AllWorkersReady over a refused Service at the next pass."""
    kind, _, name = what.partition(" ")
    return c.RUNNING if kind == "Service" or name.endswith(f"-{n.ROLE_LAUNCHER}") else c.WORKERS_READY


def object_conflict(
    body: Mapping[str, Any], kind: str, name: str, why: str, now: datetime, *, condition: str = c.WORKERS_READY
) -> Plan:
    """An object with a name the run uses exists but is not the run's (``why``: :func:`.ownership.not_ours`):
    say so in ``condition`` (WorkersReady; Running for the launcher's pod) and an Event, wait."""
    st = _Status.of(body, now)
    text = conflict_text(kind, name, why)
    st.cond(condition, "False", Reason.NAME_CONFLICT, text)
    st.say(text)
    changed = st.changed(condition, message=True)
    return Plan(status=st.dump(), events=[("Warning", Reason.NAME_CONFLICT, text)] if changed else [])


def launcher_taken(body: Mapping[str, Any], name: str, why: str, now: datetime) -> Plan:
    """The operator's create of the launcher was answered 409 by a pod it did not create but that carries the run's
    ownerReference and labels (:func:`.ownership.held_launcher`): the run fails with ``NameConflict`` naming it.
    Waiting would not do: that pod passes every check but the operator's record, and whatever it prints is not
    the run's result (only a run that failed so is checked for it: :func:`.ownership.launcher_refused`)."""
    st = _Status.of(body, now)
    text = conflict_text("Pod", name, why, "the run failed: its launcher's name was taken")
    st.fail(Reason.NAME_CONFLICT, text)
    return Plan(status=st.dump(), events=[("Warning", Phase.FAILED, text)])
