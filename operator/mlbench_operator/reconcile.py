"""The operator's decisions, as pure functions of (run, its pods, now).

:func:`admit` resolves a run against its task once and snapshots the task; :func:`plan`
then maps the run's status and the observed pods to the next status and the actions that
move the world towards it. The kopf glue in :mod:`.handlers` only executes the plan, so a
restarted operator that sees the same cluster makes the same decisions (state lives in the
resource and the pods, never in memory).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from mlbench_api.common import MAX_INT32, ObjectMeta
from mlbench_api.config import OverrideNotAllowed, effective_config
from mlbench_api.errors import format_errors
from mlbench_api.results import RunSummary
from mlbench_api.run import BenchmarkRun, BenchmarkRunSpec, CleanPodPolicy, RunPolicy, RunResult
from mlbench_api.task import BenchmarkTaskSpec
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.builders import RunContext
from mlbench_operator.datasets import FetchAction, FetchState
from mlbench_operator.podview import INVALID_INPUT, PodView
from mlbench_operator.policy import AdmissionPolicy, violations

DEFAULT_POLICY = AdmissionPolicy()

TERMINAL = ("Succeeded", "Failed")
#: A pod still Terminating this long after its deletionTimestamp (the end of its grace period) is on
#: a lost node: the kubelet will never confirm, so it is force-deleted (its name is needed again).
FORCE_DELETE_AFTER_SECONDS = 60.0
#: Appended to WorkersReady's message once the end-of-run cleanup is done (a real status change).
CLEANED_UP = "pods cleaned up per cleanPodPolicy"


@dataclass(frozen=True)
class Rejection:
    """Why a run cannot start; it ends Failed with this reason, having created nothing."""

    reason: str
    message: str


@dataclass
class Plan:
    """The next status and what to do to the world to get there."""

    status: dict[str, Any]
    create_workers: list[int] = field(default_factory=list)
    create_launcher: bool = False
    #: pods of earlier attempts to delete (gang restart): name -> UID. Only this run's own pods, and each
    #: delete is conditional on the UID, so neither a foreign pod with our labels nor the next attempt's
    #: pod of the same name is ever touched (a label-selector deletecollection would do both).
    delete_stale: dict[str, str] = field(default_factory=dict)
    cleanup: list[str] = field(default_factory=list)  #: pods to delete as the run finishes
    force_delete: list[str] = field(default_factory=list)  #: pods stuck Terminating (lost node): grace 0
    events: list[tuple[str, str, str]] = field(default_factory=list)  #: (type, reason, message)
    #: a failed launcher about to be deleted by a gang restart: its log's tail goes into an Event first,
    #: so each attempt's mpirun output outlives the pod (the launcher's name repeats across attempts)
    keep_log_of: str | None = None
    requeue_after: float | None = None  #: wake up by then even without pod events (deadline)

    @property
    def terminal(self) -> bool:
        return self.status.get("phase") in TERMINAL


def _short(err: Exception, limit: int = 2048) -> str:
    text = "; ".join(format_errors(err)) if isinstance(err, ValidationError) else str(err)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_run(body: Mapping[str, Any]) -> BenchmarkRun:
    """The run's spec through the API models (the CRD schema already checked most of it)."""
    meta = body.get("metadata") or {}
    return BenchmarkRun(
        metadata=ObjectMeta(name=meta.get("name", ""), namespace=meta.get("namespace")),
        spec=BenchmarkRunSpec.model_validate(body.get("spec") or {}),
    )


def context(
    body: Mapping[str, Any],
    snapshot: Mapping[str, Any],
    run_as_user: int | None = n.RUNNER_UID,
    dataset_claim: str = n.DATASET_VOLUME,
) -> RunContext:
    """Rebuild the run's context from its spec and task snapshot; raises ValueError if invalid."""
    run = validate_run(body)
    meta = body.get("metadata") or {}
    task = BenchmarkTaskSpec.model_validate(snapshot)
    task_name = run.spec.task_ref.name
    config = effective_config(run, task_name, task, output_dir=n.OUTPUT_DIR, metrics_port=n.METRICS_PORT)
    return RunContext(
        name=run.metadata.name,
        namespace=run.metadata.namespace or "default",
        uid=meta.get("uid", ""),
        task_name=task_name,
        spec=run.spec,
        config=config,
        run_as_user=run_as_user,
        dataset_claim=dataset_claim,
    )


def admit(
    body: Mapping[str, Any],
    task: Mapping[str, Any] | None,
    run_as_user: int | None = n.RUNNER_UID,
    dataset_claim: str = n.DATASET_VOLUME,
    policy: AdmissionPolicy = DEFAULT_POLICY,
) -> tuple[RunContext, dict[str, Any]] | Rejection:
    """Resolve the run against its task (``None``: not found) and the admin's :mod:`.policy`; the snapshot
    is the task's validated spec."""
    task_name = ((body.get("spec") or {}).get("taskRef") or {}).get("name", "")
    try:
        validate_run(body)
    except ValueError as err:
        return Rejection("InvalidSpec", f"spec is invalid: {_short(err)}")
    if task is None:
        return Rejection("TaskNotFound", f"BenchmarkTask {task_name!r} does not exist")
    try:
        snapshot = BenchmarkTaskSpec.model_validate(task.get("spec") or {}).to_api()
    except ValueError as err:
        return Rejection("InvalidTask", f"BenchmarkTask {task_name!r} is invalid: {_short(err)}")
    try:
        ctx = context(body, snapshot, run_as_user, dataset_claim)
    except OverrideNotAllowed as err:
        return Rejection("OverrideNotAllowed", str(err))
    except ValueError as err:
        return Rejection("InvalidConfig", f"the effective configuration is invalid: {_short(err)}")
    spec = body.get("spec") or {}
    image_field = "spec.image" if ctx.spec.image else f"BenchmarkTask {task_name!r} runner.image"
    broken = violations(ctx.image, image_field, spec.get("scheduling"), ctx.task.dataset.volume, policy)
    if broken:
        return Rejection("PolicyViolation", "; ".join(broken))
    return ctx, snapshot


class _Status:
    """Builds the next status from the previous one."""

    def __init__(self, body: Mapping[str, Any], now: datetime) -> None:
        self.old: dict[str, Any] = dict(body.get("status") or {})
        self.new: dict[str, Any] = copy.deepcopy(self.old)
        self.now = now
        self.generation = (body.get("metadata") or {}).get("generation")
        self.new["observedGeneration"] = self.generation
        self.new.setdefault("conditions", [])

    def cond(self, type_: str, status: str, reason: str, message: str = "") -> None:
        self.new["conditions"] = c.set_condition(
            self.new["conditions"], type_, status, reason, message, now=self.now, generation=self.generation
        )

    def in_progress(self) -> None:
        self.cond(c.GOAL_REACHED, "Unknown", "NoResultYet", "the run has not finished")
        self.cond(c.SUCCEEDED, "False", "InProgress", "")
        self.cond(c.FAILED, "False", "InProgress", "")

    def fail(self, reason: str, message: str) -> None:
        self.new["phase"] = "Failed"
        self.new["message"] = message
        self.new.setdefault("completionTime", c.timestamp(self.now))
        self.cond(c.WORKERS_READY, "False", "RunFailed", "the run failed")
        self.cond(c.RUNNING, "False", "RunFailed", "the run failed")
        self.cond(c.GOAL_REACHED, "False", "RunFailed", "the run failed before it reported a result")
        self.cond(c.SUCCEEDED, "False", reason, message)
        self.cond(c.FAILED, "True", reason, message)


def rejected_status(body: Mapping[str, Any], rejection: Rejection, now: datetime) -> dict[str, Any]:
    """Status for a run that cannot start (nothing was created)."""
    st = _Status(body, now)
    st.new["workers"] = {"ready": 0, "total": int((body.get("spec") or {}).get("workers", 1))}
    st.new["restarts"] = 0
    st.fail(rejection.reason, rejection.message)
    return st.new


def failed_status(body: Mapping[str, Any], reason: str, message: str, now: datetime) -> dict[str, Any]:
    """Status for an admitted run that fails outside :func:`plan` (restarts and workers are kept)."""
    st = _Status(body, now)
    st.fail(reason, message)
    return st.new


def admitted_status(
    body: Mapping[str, Any], ctx: RunContext, snapshot: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """Status right after admission: the task snapshot is fixed from here on."""
    st = _Status(body, now)
    st.new.update(
        phase="Pending",
        taskSnapshot=snapshot,
        startTime=c.timestamp(now),
        restarts=0,
        workers={"ready": 0, "total": ctx.spec.workers},
        message=f"creating {ctx.spec.workers} workers",
    )
    st.cond(c.WORKERS_READY, "False", "Creating", f"0/{ctx.spec.workers} workers ready")
    st.cond(c.RUNNING, "False", "WaitingForWorkers", "the launcher starts once every worker is Ready")
    st.in_progress()
    return st.new


def _summary_result(summary: RunSummary, image: str | None = None, workers: Iterable[PodView] = ()) -> dict[str, Any]:
    """``status.result``: the summary's figures, and exactly what ran (the image asked for and the digests
    the workers' containers resolved it to, so a result stays attributable after a tag moves)."""
    ids = sorted({p.image_id for p in workers if p.image_id})
    return RunResult(
        image=image,
        image_ids=ids[:8] or None,
        goal_reached=summary.goal_reached,
        time_to_goal_seconds=summary.time_to_goal_seconds,
        best_accuracy=summary.best_accuracy,
        final_accuracy=summary.final_accuracy,
        epochs=summary.epochs,
        wall_clock_seconds=summary.wall_clock_seconds,
        compute_seconds=summary.compute_seconds,
        communication_seconds=summary.communication_seconds,
        samples_per_second=summary.samples_per_second,
        world_size=summary.environment.world_size,
    ).to_api()


def final_progress(old: Mapping[str, Any] | None, summary: RunSummary, now: datetime) -> dict[str, Any]:
    """``status.progress`` of a finished run: the summary's final figures, not the last scrape.

    Rank 0 is scraped every MLBENCH_PROGRESS_SECONDS, so the last scrape usually predates the
    final evaluation; ``kubectl get br`` must show the epoch and accuracy the run ended with.
    """
    out = dict(old or {})
    out["epoch"] = float(summary.epochs)
    if summary.final_accuracy is not None:
        out["lastAccuracy"] = summary.final_accuracy
    out["samplesPerSecond"] = summary.samples_per_second
    out["updatedAt"] = c.timestamp(now)
    return out


def clean_pod_policy(spec: Mapping[str, Any] | None) -> CleanPodPolicy:
    """``spec.runPolicy.cleanPodPolicy`` from the raw spec (usable even when the spec no longer validates)."""
    raw = ((spec or {}).get("runPolicy") or {}).get("cleanPodPolicy")
    try:
        return CleanPodPolicy(raw) if raw else RunPolicy().clean_pod_policy
    except ValueError:
        return RunPolicy().clean_pod_policy


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


def cleanup_pending(body: Mapping[str, Any], pods: Iterable[PodView]) -> list[str]:
    """A finished run's pods that its cleanPodPolicy still wants deleted (empty: cleanup done).

    Derived from the cluster alone (terminal phase + pods present), so a cleanup interrupted by an
    operator restart or a failed delete is re-driven until done.
    """
    uid = (body.get("metadata") or {}).get("uid", "")
    mine, _ = _own(pods, uid)
    return _cleanup(clean_pod_policy(body.get("spec")), mine)


def cleaned_up_status(body: Mapping[str, Any], pods: Iterable[PodView], now: datetime) -> dict[str, Any]:
    """A finished run's status once its cleanup is done: ``workers.ready`` recounted, WorkersReady says so.

    Always a real change after a cleanup (the message gains :data:`CLEANED_UP`), so the run gets a watch
    event after the daemon stopped and kopf can release the finalizer.
    """
    st = _Status(body, now)
    uid = (body.get("metadata") or {}).get("uid", "")
    mine, _ = _own(pods, uid)
    restarts = int(st.old.get("restarts") or 0)
    ready = sum(1 for p in mine if p.role == n.ROLE_WORKER and p.attempt == restarts and p.ready and not p.terminating)
    total = int((st.old.get("workers") or {}).get("total") or (body.get("spec") or {}).get("workers") or 0)
    st.new["workers"] = {"ready": ready, "total": total}
    wr = c.get(st.new["conditions"], c.WORKERS_READY) or {}
    msg = wr.get("message") or "the run finished"
    if CLEANED_UP not in msg:
        msg = f"{msg}; {CLEANED_UP} {clean_pod_policy(body.get('spec')).value}"
    st.cond(c.WORKERS_READY, "False", wr.get("reason") or "RunFinished", msg)
    return st.new


def _reject_non_finite(value: str) -> Any:
    raise ValueError(f"the result contains {value}, which is not a number Kubernetes can store")


def _check_finite(data: Any, path: str = "") -> None:
    if isinstance(data, float) and not math.isfinite(data):
        raise ValueError(f"the result's {path or 'value'} is {data}, which is not a number Kubernetes can store")
    if isinstance(data, dict):
        for k, v in data.items():
            _check_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            _check_finite(v, f"{path}[{i}]")


def parse_summary(text: str) -> RunSummary:
    """The launcher's RunSummary; ValueError when malformed or when it holds NaN/Infinity (or overflows
    to it, e.g. ``1e999``): the API server rejects non-finite numbers, which would wedge the status."""
    try:
        data = json.loads(text, parse_constant=_reject_non_finite)
    except json.JSONDecodeError as exc:
        raise ValueError(f"termination message is not JSON: {exc}") from exc
    _check_finite(data)
    return RunSummary.model_validate(data)


def _find_failure(
    run: str, workers: Mapping[int, PodView], launcher: PodView | None, total: int, was_running: bool
) -> tuple[str, str] | None:
    """The first real failure of the current world, as (reason, message).

    A failed worker is the root cause and wins over the launcher, whose mpirun fails only as
    its echo (a rank OOM-killed or a worker container killed takes the launcher down too).
    """
    for rank in sorted(workers):
        if workers[rank].phase == "Failed":
            return workers[rank].failure()
    # A worker gone with its node (deleted, evicted by the node controller) takes mpirun down with
    # "ORTE has lost communication": the lost worker is the cause, not the launcher's echo of it.
    lost = [r for r in range(total) if r not in workers or workers[r].terminating]
    if launcher is not None and lost and launcher.phase != "Succeeded":
        pod_name = n.worker_name(run, lost[0])
        return "WorkerLost", f"worker {lost[0]} (pod {pod_name}) disappeared while the launcher was running"
    if launcher is not None and launcher.phase == "Failed":
        return launcher.failure()
    if was_running and (launcher is None or launcher.terminating):
        return "LauncherLost", f"launcher (pod {n.launcher_name(run)}) disappeared while it was running"
    for rank in sorted(workers):
        pod = workers[rank]
        if pod.phase == "Succeeded" and (launcher is None or not launcher.finished):
            return "WorkerExited", f"worker {rank} (pod {pod.name}) exited before the launcher finished"
    return None


#: Failures a gang restart would only repeat: the run fails at once instead of burning maxRestarts.
PERMANENT_FAILURES = frozenset({INVALID_INPUT})


#: How long a failed launcher's workers get to report their own cause before the launcher is blamed.
ROOT_CAUSE_GRACE_SECONDS = 10.0


def _root_cause_wait(
    launcher: PodView | None, workers: Mapping[int, PodView], total: int, now: datetime
) -> float | None:
    """Seconds to hold a launcher failure while a still-running worker may report the real cause.

    The launcher and a worker whose rank died fail within a second or two of each other, in
    either order; without this the reported reason would depend on which status arrived first.
    None: decide now (no launcher failure, a worker already failed or is lost, none is running,
    or the grace is over).
    """
    if launcher is None or launcher.phase != "Failed" or launcher.finished_at is None:
        return None
    if any(w.phase == "Failed" or w.terminating for w in workers.values()) or len(workers) < total:
        return None  # a worker already tells the cause (failed, or lost)
    if not any(w.phase == "Running" for w in workers.values()):
        return None
    finished = c.parse_time(launcher.finished_at)
    if finished is None:
        return None
    left = ROOT_CAUSE_GRACE_SECONDS - (now - finished).total_seconds()
    return left if left > 0 else None


#: ``runPolicy.progressDeadlineSeconds`` when unset: ten minutes without a step is no slow epoch.
PROGRESS_DEADLINE_SECONDS = 600


def _no_progress(
    progress: Mapping[str, Any] | None, policy: RunPolicy, now: datetime
) -> tuple[bool, str, float | None]:
    """(stalled, why, seconds until it would be): the step counter rank 0 reports has not moved for
    the progress deadline. Only once a step was seen (an image that serves no metrics is never Stalled)."""
    since = c.parse_time((progress or {}).get("stepChangedAt"))
    if since is None:
        return False, "", None
    deadline = policy.progress_deadline_seconds or PROGRESS_DEADLINE_SECONDS
    idle = (now - since).total_seconds()
    if idle < deadline:
        return False, "", deadline - idle
    step = (progress or {}).get("step")
    why = f"the step counter has stayed at {step} for {idle:.0f} s (runPolicy.progressDeadlineSeconds={deadline})"
    return True, why, None


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


def plan(body: Mapping[str, Any], ctx: RunContext, pods: Iterable[PodView], now: datetime) -> Plan:
    """Next status and actions for an admitted, unfinished run."""
    st = _Status(body, now)
    pods, foreign = _own(pods, ctx.uid)
    policy = ctx.spec.run_policy or RunPolicy()
    total = ctx.spec.workers
    restarts = int(st.old.get("restarts") or 0)
    st.new["restarts"] = restarts
    current = [p for p in pods if p.attempt == restarts]
    stale = [p for p in pods if p.attempt != restarts]
    workers = {p.rank: p for p in current if p.role == n.ROLE_WORKER and p.rank is not None and p.rank < total}
    launcher = next((p for p in current if p.role == n.ROLE_LAUNCHER), None)
    ready = sum(1 for p in workers.values() if p.ready and not p.terminating)
    st.new["workers"] = {"ready": ready, "total": total}
    out = Plan(status=st.new)
    old_phase = st.old.get("phase")
    out.force_delete = sorted(p.name for p in pods if _stuck_terminating(p, now))
    # pods on a lost node send no more events: look again when they would count as stuck
    waits = [_until_stuck(p, now) for p in pods if p.terminating and p.name not in out.force_delete]
    out.requeue_after = min((w for w in waits if w is not None), default=None)

    def finish(cleanup: bool = True) -> Plan:
        if cleanup:
            out.cleanup = _cleanup(policy.clean_pod_policy, pods)
        phase = st.new["phase"]
        kind = "Normal" if phase == "Succeeded" else "Warning"
        out.events.append((kind, phase, st.new.get("message", "")))
        return out

    # 1. The launcher finished successfully: its termination message is the result.
    if launcher is not None and launcher.phase == "Succeeded":
        text = (launcher.term_message or "").strip()
        try:
            if not text:
                raise ValueError("the launcher exited 0 but wrote no termination message")
            summary = parse_summary(text)
            result = _summary_result(summary, ctx.image, workers.values())
            _check_finite(result)
        except ValueError as err:
            st.fail("InvalidResult", f"launcher {launcher.name} succeeded but its result is unusable: {_short(err)}")
            return finish()
        st.new.update(phase="Succeeded", result=result, progress=final_progress(st.old.get("progress"), summary, now))
        st.new.setdefault("completionTime", c.timestamp(now))
        if summary.goal_reached:
            ttg = summary.time_to_goal_seconds
            msg = f"goal reached{f' in {ttg:.1f} s' if ttg is not None else ''}"
            reason = "GoalReached"
        else:
            msg = f"finished without reaching the goal ({summary.stop_reason or summary.status})"
            reason = "Aborted" if summary.status == "aborted" else "GoalNotReached"
        if summary.best_accuracy is not None:
            msg += f"; best accuracy {summary.best_accuracy:.4f}"
        st.new["message"] = msg
        st.cond(c.WORKERS_READY, "False", "RunFinished", "the run finished")
        st.cond(c.RUNNING, "False", "Completed", f"launcher {launcher.name} completed")
        st.cond(c.GOAL_REACHED, "True" if summary.goal_reached else "False", reason, msg)
        st.cond(c.SUCCEEDED, "True", reason, msg)
        st.cond(c.FAILED, "False", "Succeeded", "")
        return finish()

    # 1b. The launcher failed but rank 0 reported (the run aborted, e.g. diverged): a restart would repeat it.
    if launcher is not None and launcher.phase == "Failed" and launcher.term_message:
        aborted: RunSummary | None
        try:
            aborted = parse_summary(launcher.term_message)
            aborted_result = _summary_result(aborted, ctx.image, workers.values())
            _check_finite(aborted_result)
        except ValueError:
            aborted = None
        # Only an "aborted" summary means "a restart would repeat it"; any other status is a crash.
        if aborted is not None and aborted.status == "aborted":
            summary = aborted
            st.new["result"] = aborted_result
            st.fail(
                "Aborted",
                f"the run aborted ({summary.stop_reason or summary.status}); "
                f"launcher {launcher.name} exit code {launcher.exit_code}",
            )
            st.cond(c.GOAL_REACHED, "False", "Aborted", "the run aborted before reaching the goal")
            return finish()

    # 2. Out of time.
    start = c.parse_time(st.old.get("startTime"))
    deadline = policy.active_deadline_seconds
    if deadline is not None and start is not None:
        left = (start + _seconds(deadline) - now).total_seconds()
        if left <= 0:
            st.fail("DeadlineExceeded", f"the run exceeded runPolicy.activeDeadlineSeconds={deadline}")
            return finish()
        out.requeue_after = min(left, out.requeue_after) if out.requeue_after is not None else left

    # 3. A failed rank fails the world: restart the whole gang or give up.
    was_running = c.is_true(st.old.get("conditions"), c.RUNNING)
    hold = _root_cause_wait(launcher, workers, total, now)
    if hold is not None:
        out.requeue_after = min(hold, out.requeue_after) if out.requeue_after is not None else hold
        return out
    failure = _find_failure(ctx.name, workers, launcher, total, was_running) if not stale else None
    if failure is not None:
        reason, message = failure
        if reason in PERMANENT_FAILURES:
            st.fail(reason, f"{message} (not restarted: the runner refused its input, a restart would repeat it)")
            return finish()
        if restarts >= policy.max_restarts:
            st.fail(reason, f"{message} (gave up after {restarts} of maxRestarts={policy.max_restarts} restarts)")
            return finish()
        restarts += 1
        text = f"restart {restarts}/{policy.max_restarts}: {message}"
        st.new.update(restarts=restarts, phase="Pending", message=text, workers={"ready": 0, "total": total})
        st.cond(c.WORKERS_READY, "False", "Restarting", text)
        st.cond(c.RUNNING, "False", "Restarting", text)
        st.cond(c.RESTARTED, "True", reason, text)
        out.delete_stale = _deletable(pods)
        out.events.append(("Warning", "Restarting", text))
        if launcher is not None and launcher.phase == "Failed":
            out.keep_log_of = launcher.name
        return out

    # 4. Make progress: clear the previous world, create workers, then the launcher.
    if stale:
        out.delete_stale = _deletable(stale)
        st.new["phase"] = "Pending"
        msg = f"waiting for {len(stale)} pods of the previous attempt to terminate"
        st.cond(c.WORKERS_READY, "False", "Restarting", msg)
        st.cond(c.RUNNING, "False", "Restarting", msg)
        st.in_progress()
        st.new["message"] = msg
        return out

    held = {p.name: p for p in foreign}
    if launcher is None:
        out.create_workers = [r for r in range(total) if r not in workers]
    wanted = {n.worker_name(ctx.name, r): r for r in out.create_workers}
    blocked = [held[name] for name in sorted(held) if name in wanted]  # names taken by another owner's pods
    out.create_workers = [r for name, r in wanted.items() if name not in held]
    prev_wr = c.get(st.old.get("conditions"), c.WORKERS_READY) or {}
    prev_run = c.get(st.old.get("conditions"), c.RUNNING) or {}
    unsched = sorted((p for p in workers.values() if p.unschedulable), key=lambda p: p.rank or 0)
    stuck = sorted((p for p in workers.values() if p.waiting), key=lambda p: p.rank or 0)
    all_scheduled = len(workers) == total and all(p.scheduled for p in workers.values())
    if ready == total:
        st.cond(c.WORKERS_READY, "True", "AllWorkersReady", f"{ready}/{total} workers ready")
    elif prev_wr.get("reason") == "CreateFailed" and out.create_workers:
        # the API server refused a create (quota, policy): keep saying so while we retry
        st.cond(c.WORKERS_READY, "False", "CreateFailed", prev_wr.get("message", ""))
    elif blocked:
        st.cond(
            c.WORKERS_READY,
            "False",
            "NameConflict",
            f"pod {blocked[0].name} belongs to another owner (uid {blocked[0].owner_uid}, e.g. a deleted run "
            "of the same name); waiting for it to be deleted",
        )
    elif unsched:
        st.cond(
            c.WORKERS_READY,
            "False",
            "Unschedulable",
            f"{len(unsched)}/{total} workers cannot be scheduled: {unsched[0].unschedulable}",
        )
    elif stuck:
        st.cond(c.WORKERS_READY, "False", "ContainerWaiting", f"worker {stuck[0].rank}: {stuck[0].waiting}")
    else:
        st.cond(c.WORKERS_READY, "False", "WaitingForWorkers", f"{ready}/{total} workers ready")

    if launcher is not None and launcher.phase == "Running":
        st.new["phase"] = "Running"
        st.cond(c.RUNNING, "True", "LauncherRunning", f"launcher {launcher.name} is running mpirun")
    elif launcher is not None:
        st.new["phase"] = "Starting"
        why = launcher.waiting or launcher.unschedulable
        detail = f": {why}" if why else ""
        st.cond(c.RUNNING, "False", "LauncherStarting", f"launcher {launcher.name} is {launcher.phase}{detail}")
    elif ready == total:
        st.new["phase"] = "Starting"
        blocker = held.get(n.launcher_name(ctx.name))
        out.create_launcher = blocker is None
        if blocker is not None:
            st.cond(
                c.RUNNING,
                "False",
                "NameConflict",
                f"pod {blocker.name} belongs to another owner (uid {blocker.owner_uid}); waiting for it to be deleted",
            )
        elif prev_run.get("reason") == "CreateFailed":
            st.cond(c.RUNNING, "False", "CreateFailed", prev_run.get("message", ""))
        else:
            st.cond(c.RUNNING, "False", "CreatingLauncher", "every worker is Ready; creating the launcher")
    else:
        st.new["phase"] = "Starting" if all_scheduled else "Pending"
        st.cond(c.RUNNING, "False", "WaitingForWorkers", "the launcher starts once every worker is Ready")
    st.in_progress()
    wr = c.get(st.new["conditions"], c.WORKERS_READY) or {}
    run = c.get(st.new["conditions"], c.RUNNING) or {}
    st.new["message"] = f"{wr.get('message', '')}; {run.get('message', '')}"
    if st.new["phase"] == "Running":
        stalled, why, wait = _no_progress(st.old.get("progress"), policy, now)
        was = c.get(st.old.get("conditions"), c.STALLED) or {}
        st.cond(c.STALLED, "True" if stalled else "False", c.NO_PROGRESS if stalled else "Running", why)
        if stalled and (was.get("status"), was.get("reason")) != ("True", c.NO_PROGRESS):
            out.events.append(("Warning", c.NO_PROGRESS, why))
        if wait is not None:
            out.requeue_after = min(wait, out.requeue_after) if out.requeue_after is not None else wait
    if st.new["phase"] != old_phase:
        out.events.append(("Normal", st.new["phase"], st.new["message"]))
    if (
        wr.get("reason") == "Unschedulable"
        and (c.get(st.old.get("conditions"), c.WORKERS_READY) or {}).get("reason") != "Unschedulable"
    ):
        out.events.append(("Warning", "Unschedulable", wr.get("message", "")))
    return out


def dataset_plan(body: Mapping[str, Any], state: FetchState, now: datetime) -> Plan:
    """Status while the run's dataset is fetched (no worker exists yet), once it is there, or when it failed.

    DatasetReady carries the state; an Event is planned only when that condition changes (not for every
    retry-count update of the message).
    """
    st = _Status(body, now)
    out = Plan(status=st.new)
    old = c.get(st.old.get("conditions"), c.DATASET_READY) or {}
    deadline = ((body.get("spec") or {}).get("runPolicy") or {}).get("activeDeadlineSeconds")
    start = c.parse_time(st.old.get("startTime"))
    left = (start + _seconds(deadline) - now).total_seconds() if deadline and start else None
    if left is not None and left <= 0 and state.action not in (FetchAction.READY, FetchAction.FAIL):
        message = f"the run exceeded runPolicy.activeDeadlineSeconds={deadline} while {state.message}"
        st.fail("DeadlineExceeded", message)
        out.events.append(("Warning", "Failed", message))
        return out
    out.requeue_after = left
    if state.action is FetchAction.READY:
        st.cond(c.DATASET_READY, "True", state.reason.value, state.message)
    elif state.action is FetchAction.FAIL:
        st.cond(c.DATASET_READY, "False", state.reason.value, state.message)
        st.fail(state.reason.value, state.message)
    else:
        st.new["phase"] = "Pending"
        st.cond(c.DATASET_READY, "False", state.reason.value, state.message)
        st.cond(c.WORKERS_READY, "False", c.WAITING_FOR_DATASET, "workers are created once the dataset is ready")
        st.cond(c.RUNNING, "False", "WaitingForWorkers", "the launcher starts once every worker is Ready")
        st.in_progress()
        st.new["message"] = state.message
    new = c.get(st.new["conditions"], c.DATASET_READY) or {}
    if (old.get("status"), old.get("reason")) != (new.get("status"), new.get("reason")):
        kind = "Warning" if state.action is FetchAction.FAIL else "Normal"
        out.events.append((kind, state.reason.value, state.message))
    return out


def finalize(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The status as it is written: text from pods cleaned, and the kstatus conditions derived.

    ``Ready``, ``Reconciling`` and ``Stalled`` are a projection of the phase and the ``Failed``
    condition, computed here at write time, so that no policy can forget them and generic tools
    (Flux, Argo CD, ``kubectl wait --for=condition=Ready``) read every run the same way. The one
    input of its own is a ``Stalled``/``NoProgress`` set by :func:`plan` while Running.
    """
    new = dict(status)
    if isinstance(new.get("message"), str):
        new["message"] = c.clean(new["message"])[:32768]
    phase = new.get("phase")
    if not phase:
        return new
    conds = list(new.get("conditions") or [])
    message = new.get("message") or ""
    failed = c.get(conds, c.FAILED) or {}
    stalled = c.get(conds, c.STALLED) or {}
    if phase == "Succeeded":
        ready = ("True", "Succeeded", message)
    elif phase == "Failed":
        ready = ("False", failed.get("reason") or "Failed", failed.get("message") or message)
    else:
        ready = ("False", phase, message)
    reconciling = ("False", phase, "the run finished") if phase in TERMINAL else ("True", phase, message)
    if phase == "Failed":
        stuck = ("True", ready[1], ready[2])
    elif phase == "Running" and (stalled.get("status"), stalled.get("reason")) == ("True", c.NO_PROGRESS):
        stuck = ("True", c.NO_PROGRESS, stalled.get("message") or "")
    else:
        stuck = ("False", phase, "")
    gen = new.get("observedGeneration")
    for type_, (value, reason, text) in ((c.READY, ready), (c.RECONCILING, reconciling), (c.STALLED, stuck)):
        conds = c.set_condition(conds, type_, value, reason, text, now=now, generation=gen)
    new["conditions"] = conds
    return new


#: A status the API server refused (422) is replaced by this much, which it always accepts.
UNSTORABLE_MESSAGE_LIMIT = 1024


def unstorable_status(old: Mapping[str, Any], detail: str, now: datetime) -> dict[str, Any]:
    """The run fails with InvalidResult when the API server refused (422) a status write.

    Built from scratch rather than from the refused status: only fixed reasons, a short cleaned
    message and the stored fields, so this write cannot be refused for the same cause and the
    run cannot be retried forever while its workers hold their GPUs.
    """
    message = c.clean(f"the operator could not store the run's status (HTTP 422): {detail}")
    message = message[: UNSTORABLE_MESSAGE_LIMIT - 3] + "..." if len(message) > UNSTORABLE_MESSAGE_LIMIT else message
    gen = old.get("observedGeneration")
    gen = gen if isinstance(gen, int) and 0 <= gen <= 2**53 else None
    conds: list[c.Condition] = []
    for type_, value in ((c.SUCCEEDED, "False"), (c.FAILED, "True")):
        conds = c.set_condition(conds, type_, value, "InvalidResult", message, now=now, generation=gen)
    out: dict[str, Any] = {
        "phase": "Failed",
        "message": message,
        "conditions": conds,
        "completionTime": old.get("completionTime") or c.timestamp(now),
    }
    return finalize(out, now)


def generation_patch(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"observedGeneration": g}`` for a finished run whose spec (runPolicy: ttl, cleanup) was edited
    after its daemon stopped, so that kstatus readers do not wait forever; None when current or unfinished
    (an unfinished run's daemon writes it with its next status)."""
    status = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    if status.get("phase") not in TERMINAL or generation is None or status.get("observedGeneration") == generation:
        return None
    return {"observedGeneration": generation}


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level status keys that changed (a JSON merge patch for the status subresource)."""
    return {k: v for k, v in new.items() if old.get(k) != v}


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

    422 (the object is invalid: it will never be accepted) fails the run; anything else (403 from a
    ResourceQuota, PodSecurity or a webhook: may pass later) is shown as CreateFailed on WorkersReady
    (or Running, for the launcher) while the caller retries with backoff. A Warning Event is planned
    whenever the message changes, not on every retry.
    """
    st = _Status(body, now)
    out = Plan(status=st.new)
    name, code, detail = next((f for f in failures if f[1] == 422), failures[0])
    text = f"creating {name} was refused (HTTP {code}): {detail}"
    if len(failures) > 1:
        text += f" (and {len(failures) - 1} more)"
    if code == 422:
        st.fail("CreateFailed", text)
        out.events.append(("Warning", "Failed", text))
        return out
    type_ = c.RUNNING if name.endswith(f"-{n.ROLE_LAUNCHER}") else c.WORKERS_READY
    old = c.get(st.old.get("conditions"), type_) or {}
    st.cond(type_, "False", "CreateFailed", text)
    st.new["message"] = text
    if (old.get("reason"), old.get("message")) != ("CreateFailed", text):
        out.events.append(("Warning", "CreateFailed", text))
    return out


def object_conflict(body: Mapping[str, Any], kind: str, name: str, owner: str | None, now: datetime) -> Plan:
    """A Service/ConfigMap/Secret with the run's name exists but is not the run's: say so, wait."""
    st = _Status(body, now)
    out = Plan(status=st.new)
    text = (
        f"{kind} {name} already exists and is not owned by this run (owner uid {owner or 'none'}); "
        "waiting for it to be deleted"
    )
    old = c.get(st.old.get("conditions"), c.WORKERS_READY) or {}
    st.cond(c.WORKERS_READY, "False", "NameConflict", text)
    st.new["message"] = text
    if (old.get("reason"), old.get("message")) != ("NameConflict", text):
        out.events.append(("Warning", "NameConflict", text))
    return out


def controller_uid(obj: Mapping[str, Any] | None) -> str | None:
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller")), None)
