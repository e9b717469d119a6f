"""A run's plan, a pure function of (run, its pods, now).

Once :func:`.admission.admit` has admitted the run, :func:`plan` maps the run's status and the
observed pods to the next status and the actions that move the world towards it. The executor
(:mod:`.executor`) only carries the plan out, so a restarted operator that sees the same cluster makes
the same decisions (state lives in the resource and the pods, never in memory).

:func:`plan` sorts the pods once into a :class:`PlanInput` (the run's own pods of the current
attempt, of earlier attempts, and foreign pods that merely hold names) and asks the policies of
:data:`POLICIES` in order; the first that returns a :class:`Plan` decides the pass:

1. :func:`launcher_succeeded`: the launcher exited 0; its result makes the run Succeeded (or
   InvalidResult when unusable).
2. :func:`launcher_aborted`: the launcher failed with an "aborted" summary; Failed, no restart.
3. :func:`deadline_exceeded`: ``activeDeadlineSeconds`` has passed; Failed.
4. :func:`root_cause_hold`: the launcher failed while the workers still run; wait briefly for a
   worker to report the real cause.
5. :func:`gang_failure`: a failed or lost rank; restart the whole gang, or give up (a permanent
   failure, ``maxRestarts`` spent).
6. :func:`stale_attempt`: pods of an earlier attempt remain; delete them, wait.
7. :func:`startup_deadline`: the attempt has not started within ``startupDeadlineSeconds``; release its pods
   and retry after a backoff, or give up (:mod:`.startup`).
8. :func:`startup_backoff`: a startup retry's backoff has not ended; create nothing, wait.
9. :func:`make_progress`: always decides; create workers, then the launcher, and report
   WorkersReady, Running, the phase and Stalled (NoProgress).

The order is the precedence: a result beats the deadline (the run did finish), the deadline
beats a failure (no restart past it), a worker's cause beats the launcher's echo of it, and a failure
beats the startup clock (a pod that failed is a failure, not a slow start). Whatever decides, every pass
also force-deletes pods stuck Terminating on a lost node and wakes up by the earliest wait (:func:`_upkeep`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from mlbench_api.runpolicy import RunPolicy
from mlbench_api.runstatus import BenchmarkRunStatus, Phase, Progress, WorkerCounts
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodPhase, PodView
from mlbench_operator.run import mounts, nodes, startup
from mlbench_operator.run.lifecycle import (
    _cleanup,
    _deletable,
    _own,
    _seconds,
    _stuck_terminating,
    _until_stuck,
    end_policy,
)
from mlbench_operator.run.nodes import NodeState
from mlbench_operator.run.outcome import (
    PERMANENT_FAILURES,
    _find_failure,
    _root_cause_wait,
    final_progress,
    parse_summary,
    summary_result,
    world_disruption,
)
from mlbench_operator.run.ownership import launcher_record, launcher_refused
from mlbench_operator.run.status import Plan, StoredStatus, _Cond, _short, _Status, _uid
from mlbench_operator.runcontext import RunContext

#: ``runPolicy.progressDeadlineSeconds`` when unset: ten minutes without a step is no slow epoch.
PROGRESS_DEADLINE_SECONDS = 600


def _no_progress(progress: Progress | None, policy: RunPolicy, now: datetime) -> tuple[bool, str, float | None]:
    """(stalled, why, seconds until it would be): the step counter rank 0 reports has not moved for
    the progress deadline. Only once a step was seen (an image that serves no metrics is never Stalled)."""
    since = progress.step_changed_at if progress is not None else None
    if since is None:
        return False, "", None
    deadline = policy.progress_deadline_seconds or PROGRESS_DEADLINE_SECONDS
    idle = (now - since).total_seconds()
    if idle < deadline:
        return False, "", deadline - idle
    step = progress.step if progress is not None else None
    why = f"the step counter has stayed at {step} for {idle:.0f} s (runPolicy.progressDeadlineSeconds={deadline})"
    return True, why, None


# -- plan: an ordered list of policies ------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanInput:
    """Everything a policy decides from, sorted once per pass; no policy changes it.

    Only the run's own pods (controller UID = the run's) are ever acted on; ``foreign`` pods merely
    block the names they hold.
    """

    body: Mapping[str, Any]  #: the run as last written (its status is the previous decision)
    stored: StoredStatus  #: its status, parsed
    ctx: RunContext
    now: datetime
    run_policy: RunPolicy
    restarts: int  #: ``status.restarts``: the current attempt
    own: tuple[PodView, ...]  #: the run's own pods, of every attempt
    current: tuple[PodView, ...]  #: own pods of the current attempt
    stale: tuple[PodView, ...]  #: own pods of earlier attempts: deleted before the next attempt starts
    foreign: tuple[PodView, ...]  #: the run's labels but another or no controller (never adopted)
    workers: Mapping[int, PodView]  #: the current attempt's workers by rank (ranks beyond spec.workers ignored)
    launcher: PodView | None  #: the current attempt's launcher
    #: ``(reason, message)`` of the volume Events of workers that wait to start, by pod name (:mod:`.mounts`)
    mounts: Mapping[str, tuple[Reason, str]] = field(default_factory=lambda: MappingProxyType({}))
    #: what the current workers' nodes say, by node name, read once the launcher failed (:mod:`.nodes`)
    nodes: Mapping[str, NodeState] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(
        cls,
        body: Mapping[str, Any],
        ctx: RunContext,
        pods: Iterable[PodView],
        now: datetime,
        *,
        mounts: Mapping[str, tuple[Reason, str]] | None = None,
        nodes: Mapping[str, NodeState] | None = None,
    ) -> PlanInput:
        own, foreign = _own(pods, ctx.uid)
        stored = StoredStatus.parse(body.get("status"), run=_uid(body))
        restarts = stored.model.restarts or 0
        # a launcher-named pod the operator did not create for this attempt holds the name, nothing more
        impostors = [
            p
            for p in own
            if p.role == n.ROLE_LAUNCHER and p.attempt == restarts and launcher_refused(p, stored.model, restarts)
        ]
        own = [p for p in own if p not in impostors]
        foreign = [*foreign, *impostors]
        current = tuple(p for p in own if p.attempt == restarts)
        total = ctx.spec.workers
        workers = {p.rank: p for p in current if p.role == n.ROLE_WORKER and p.rank is not None and p.rank < total}
        return cls(
            body=body,
            stored=stored,
            ctx=ctx,
            now=now,
            run_policy=ctx.spec.run_policy or RunPolicy(),
            restarts=restarts,
            own=tuple(own),
            current=current,
            stale=tuple(p for p in own if p.attempt != restarts),
            foreign=tuple(foreign),
            workers=MappingProxyType(workers),
            launcher=next((p for p in current if p.role == n.ROLE_LAUNCHER), None),
            mounts=MappingProxyType(dict(mounts or {})),
            nodes=MappingProxyType(dict(nodes or {})),
        )

    @property
    def old(self) -> BenchmarkRunStatus:
        """The previous status (what of it validates: see :class:`StoredStatus`)."""
        return self.stored.model

    @property
    def total(self) -> int:
        return self.ctx.spec.workers

    @property
    def ready(self) -> int:
        """Workers of the current attempt that are Ready (a Terminating one no longer counts)."""
        return sum(1 for p in self.workers.values() if p.ready and not p.terminating)

    @property
    def deadline_left(self) -> float | None:
        """Seconds until ``runPolicy.activeDeadlineSeconds`` (<= 0: exceeded); None: no deadline."""
        start = self.old.start_time
        deadline = self.run_policy.active_deadline_seconds
        if deadline is None or start is None:
            return None
        return (start + _seconds(deadline) - self.now).total_seconds()

    @property
    def startup_left(self) -> float | None:
        """Seconds until the attempt's startup deadline (<= 0: passed); None once it has started (its launcher
        left Pending, or it has been Running) or before its first pod (:func:`.startup.left`)."""
        if c.holds(self.old.conditions, c.RUNNING):
            return None
        return startup.left(self.run_policy, self.current, self.launcher, self.now)

    def status(self) -> _Status:
        """A fresh builder for the next status, with the counts every decision reports."""
        st = _Status.following(self.stored, self.now, (self.body.get("metadata") or {}).get("generation"))
        st.new.restarts = self.restarts
        st.new.workers = WorkerCounts(ready=self.ready, total=self.total)
        st.new.launcher = launcher_record(self.old.launcher, self.launcher)  # with its image's digest once known
        return st


#: A policy: a :class:`Plan` when it decides the pass, None to leave it to the next one.
Policy = Callable[[PlanInput], Plan | None]


#: A condition as ``(status, reason, message)``.


def _finished(inp: PlanInput, st: _Status) -> Plan:
    """A terminal plan: the final status, the deletions its cleanPodPolicy wants, an Event with the outcome."""
    phase = st.new.phase or Phase.FAILED
    kind = "Normal" if phase == Phase.SUCCEEDED else "Warning"
    status = st.dump()
    return Plan(
        status=status,
        cleanup=_cleanup(end_policy({**inp.body, "status": status}), inp.own),
        events=[(kind, phase, st.new.message or "")],
    )


def launcher_succeeded(inp: PlanInput) -> Plan | None:
    """The launcher exited 0: its termination message is the result (``Succeeded``, whether or not the
    goal was reached), or ``Failed``/``InvalidResult`` when that message is unusable."""
    launcher = inp.launcher
    if launcher is None or launcher.phase != PodPhase.SUCCEEDED:
        return None
    st = inp.status()
    text = (launcher.term_message or "").strip()
    try:
        if not text:
            raise ValueError("the launcher exited 0 but wrote no termination message")
        summary = parse_summary(text)
        result = summary_result(summary, inp.ctx.image, inp.workers.values())  # a RunResult holds finite numbers
        progress = final_progress(inp.old.progress, summary, inp.now)
    except ValueError as err:
        st.fail(Reason.INVALID_RESULT, f"launcher {launcher.name} succeeded but its result is unusable: {_short(err)}")
        return _finished(inp, st)
    st.new.phase = Phase.SUCCEEDED
    st.new.result = result
    st.new.progress = progress
    if st.new.completion_time is None:
        st.new.completion_time = c.instant(inp.now)
    if summary.goal_reached:
        ttg = summary.time_to_goal_seconds
        msg = f"goal reached{f' in {ttg:.1f} s' if ttg is not None else ''}"
        reason = Reason.GOAL_REACHED
    else:
        msg = f"finished without reaching the goal ({summary.stop_reason or summary.status})"
        reason = Reason.ABORTED if summary.status == "aborted" else Reason.GOAL_NOT_REACHED
    if summary.best_accuracy is not None:
        msg += f"; best accuracy {summary.best_accuracy:.4f}"
    st.say(msg)
    st.cond(c.WORKERS_READY, "False", Reason.RUN_FINISHED, "the run finished")
    st.cond(c.RUNNING, "False", Reason.COMPLETED, f"launcher {launcher.name} completed")
    st.cond(c.GOAL_REACHED, "True" if summary.goal_reached else "False", reason, msg)
    st.cond(c.SUCCEEDED, "True", reason, msg)
    st.cond(c.FAILED, "False", Phase.SUCCEEDED, "")
    return _finished(inp, st)


def launcher_aborted(inp: PlanInput) -> Plan | None:
    """The launcher failed but rank 0 reported a summary whose status is ``aborted`` (e.g. diverged):
    ``Failed``/``Aborted`` with its figures kept, no restart (it would abort again). Any other summary
    from a failed launcher is a crash, left to :func:`gang_failure`; so is one stopped by a signal
    (stop reason ``interrupted``: a drained node, an eviction, a deleted launcher pod), which is not
    the run's own decision and restarts like any lost pod."""
    launcher = inp.launcher
    if launcher is None or launcher.phase != PodPhase.FAILED or not launcher.term_message:
        return None
    try:
        summary = parse_summary(launcher.term_message)
        result = summary_result(summary, inp.ctx.image, inp.workers.values())
    except ValueError:
        return None
    if summary.status != "aborted" or summary.stop_reason == "interrupted":
        return None
    st = inp.status()
    st.new.result = result
    st.fail(
        Reason.ABORTED,
        f"the run aborted ({summary.stop_reason or summary.status}); "
        f"launcher {launcher.name} exit code {launcher.exit_code}",
    )
    st.cond(c.GOAL_REACHED, "False", Reason.ABORTED, "the run aborted before reaching the goal")
    return _finished(inp, st)


def deadline_exceeded(inp: PlanInput) -> Plan | None:
    """``runPolicy.activeDeadlineSeconds`` has passed since ``startTime``: ``Failed``/``DeadlineExceeded``.
    (Until then the deadline only wakes the run up: see :func:`plan`.)"""
    left = inp.deadline_left
    if left is None or left > 0:
        return None
    st = inp.status()
    st.fail(
        Reason.DEADLINE_EXCEEDED,
        f"the run exceeded runPolicy.activeDeadlineSeconds={inp.run_policy.active_deadline_seconds}",
    )
    return _finished(inp, st)


def _launcher_stop_wait(
    launcher: PodView | None, workers: Mapping[int, PodView], total: int, now: datetime
) -> float | None:
    """Seconds to keep the world of a running launcher that is being deleted (a drain, an eviction,
    ``kubectl delete pod``): its PID 1 passes the stop on to the ranks through mpirun and prints rank 0's
    summary (stop reason ``interrupted``) on its way out, over the workers' ssh sessions. Deleting the
    workers at once (the gang restart for a lost launcher) could cut that off. Until the launcher has
    stopped (its pod fails or goes) or its deletion is due (``deletionTimestamp``, the kubelet's own
    deadline). None: decide now (not that case, or a worker already failed or is lost)."""
    if launcher is None or not launcher.terminating or launcher.phase != PodPhase.RUNNING:
        return None
    if any(w.phase == PodPhase.FAILED or w.terminating for w in workers.values()) or len(workers) < total:
        return None
    due = c.parse_time(launcher.deletion_timestamp)
    left = (due - now).total_seconds() if due is not None else 0.0
    return left if left > 0 else None


def launcher_stopping_hold(inp: PlanInput) -> Plan | None:
    """A running launcher is being deleted: decide nothing while it stops its ranks (see
    :func:`_launcher_stop_wait`); then :func:`gang_failure` restarts the gang as for any lost launcher."""
    if not c.holds(inp.old.conditions, c.RUNNING):
        return None
    hold = _launcher_stop_wait(inp.launcher, inp.workers, inp.total, inp.now)
    if hold is None:
        return None
    return Plan(status=inp.status().dump(), requeue_after=hold)


def root_cause_hold(inp: PlanInput) -> Plan | None:
    """The launcher failed while every worker still runs: decide nothing for up to
    :data:`ROOT_CAUSE_GRACE_SECONDS`, so that a worker can report the real cause first, and while a worker's node
    is late renewing its Lease (lost, or only late: :func:`.nodes.wait`). A node that stopped answering is the
    cause: decided at once."""
    if nodes.lost_worker(inp.workers, inp.nodes) is not None:
        return None
    waits = [w for w in (_root_cause_wait(inp.launcher, inp.workers, inp.total, inp.now), nodes.wait(inp.nodes)) if w]
    if not waits:
        return None
    return Plan(status=inp.status().dump(), requeue_after=max(waits))


def gang_failure(inp: PlanInput) -> Plan | None:
    """A failed (or lost) rank fails the whole world: restart the gang, or give up (``Failed`` with the
    cause) when the failure is permanent or ``maxRestarts`` is spent. Not while pods of the previous
    attempt remain: they are history (:func:`stale_attempt` clears them)."""
    if inp.stale:
        return None
    was_running = c.holds(inp.old.conditions, c.RUNNING)
    failure = _find_failure(inp.ctx.name, inp.workers, inp.launcher, inp.total, was_running)
    if failure is None:
        return None
    reason, message = failure
    st = inp.status()
    limit = inp.run_policy.max_restarts
    if reason in PERMANENT_FAILURES:
        st.fail(reason, f"{message} (not restarted: the runner refused its input, a restart would repeat it)")
        return _finished(inp, st)
    disrupted = world_disruption(inp.workers, inp.launcher) or nodes.lost_worker(inp.workers, inp.nodes)
    spared = inp.old.disruption_restarts or 0
    counted = inp.restarts - spared - (inp.old.startup_timeouts or 0)  # neither spends maxRestarts
    if disrupted is None and counted >= limit:
        st.fail(reason, f"{message} (gave up after {counted} of maxRestarts={limit} restarts)")
        return _finished(inp, st)
    restarts = inp.restarts + 1
    if disrupted is None:
        text = f"restart {counted + 1}/{limit}: {message}"
    else:
        reason = Reason.DISRUPTED
        text = f"restart after a disruption, not counted against maxRestarts={limit}: {disrupted}; {message}"
        st.new.disruption_restarts = spared + 1
    st.new.restarts = restarts
    st.new.phase = Phase.PENDING
    st.say(text)
    st.new.workers = WorkerCounts(ready=0, total=inp.total)
    # status.progress was the failed attempt's rank 0: its stepChangedAt would flag the next attempt Stalled
    # (NoProgress) as soon as it runs, before its first scrape. Cleared (null in the merge patch).
    st.new.progress = None
    st.cond(c.WORKERS_READY, "False", Reason.RESTARTING, text)
    st.cond(c.RUNNING, "False", Reason.RESTARTING, text)
    st.cond(c.RESTARTED, "True", reason, text)
    launcher = inp.launcher
    return Plan(
        status=st.dump(),
        # the restart is recorded (status first), then every pod of the failed attempt goes
        delete_stale=_deletable(inp.own),
        events=[("Warning", Reason.RESTARTING, text)],
        keep_log_of=launcher.name if launcher is not None and launcher.phase == PodPhase.FAILED else None,
    )


def stale_attempt(inp: PlanInput) -> Plan | None:
    """Pods of an earlier attempt remain (a gang restart is under way): delete them and wait until they
    are gone, since the next attempt reuses their names."""
    if not inp.stale:
        return None
    st = inp.status()
    st.new.phase = Phase.PENDING
    msg = f"waiting for {len(inp.stale)} pods of the previous attempt to terminate"
    st.cond(c.WORKERS_READY, "False", Reason.RESTARTING, msg)
    st.cond(c.RUNNING, "False", Reason.RESTARTING, msg)
    st.in_progress()
    st.say(msg)
    return Plan(status=st.dump(), delete_stale=_deletable(inp.stale))


def startup_deadline(inp: PlanInput) -> Plan | None:
    """The attempt has not started (every worker Ready, the launcher running) within the startup deadline
    (:mod:`.startup`): its pods are released (deleted, as in a gang restart) and WorkersReady, Running and
    Restarted say why in the pods' own words; the next attempt follows after :func:`.startup.backoff`, not
    counted against ``maxRestarts``, or the run fails ``StartupDeadlineExceeded`` once ``startupRetries``
    are spent (the cleanup then releases every unfinished pod: :func:`.lifecycle.cleanup_pending`)."""
    policy = inp.run_policy
    left = inp.startup_left
    if left is None or left > 0:
        return None
    why = startup.blockers(inp.workers, inp.launcher, inp.total, inp.mounts)
    refused = c.find(inp.old.conditions, c.WORKERS_READY)
    if refused is not None and refused.reason == Reason.CREATE_FAILED:  # why some were never created
        why += f"; {Reason.CREATE_FAILED}: {refused.message}"
    text = f"not started within runPolicy.startupDeadlineSeconds={startup.deadline(policy)}: {why}"
    timeouts, limit = inp.old.startup_timeouts or 0, policy.startup_retries
    st = inp.status()
    if timeouts >= limit:
        st.fail(Reason.STARTUP_DEADLINE_EXCEEDED, f"{text} (gave up after {timeouts} of startupRetries={limit})")
        return _finished(inp, st)
    wait = startup.backoff(policy, timeouts + 1)
    text = f"pods released, startup retry {timeouts + 1}/{limit} in {wait} s: {text}"
    st.new.restarts = inp.restarts + 1
    st.new.startup_timeouts = timeouts + 1
    st.new.startup_retry_at = c.instant(inp.now + timedelta(seconds=wait))
    st.new.phase = Phase.PENDING
    st.new.workers = WorkerCounts(ready=0, total=inp.total)
    st.new.progress = None
    st.say(text)
    st.cond(c.WORKERS_READY, "False", Reason.STARTUP_DEADLINE_EXCEEDED, text)
    st.cond(c.RUNNING, "False", Reason.STARTUP_DEADLINE_EXCEEDED, text)
    st.cond(c.RESTARTED, "True", Reason.STARTUP_DEADLINE_EXCEEDED, text)
    events: list[tuple[str, str, str]] = [("Warning", Reason.STARTUP_DEADLINE_EXCEEDED, text)]
    return Plan(status=st.dump(), delete_stale=_deletable(inp.own), events=events, requeue_after=wait or None)


def startup_backoff(inp: PlanInput) -> Plan | None:
    """After a startup timeout, until ``status.startupRetryAt``: no pod is created (WorkersReady still says why
    the last attempt was released)."""
    wait = startup.retry_wait(inp.old.startup_retry_at, inp.now)
    if wait is None or inp.current:
        return None
    st = inp.status()
    st.new.phase = Phase.PENDING
    st.in_progress()
    return Plan(status=st.dump(), requeue_after=wait)


def _workers_to_create(inp: PlanInput, held: Mapping[str, PodView]) -> tuple[list[int], list[PodView]]:
    """(ranks to create now, foreign pods holding the names of others): missing workers are created only
    before the launcher exists (afterwards a missing worker is a failure, not a gap to fill)."""
    wanted = [] if inp.launcher is not None else [r for r in range(inp.total) if r not in inp.workers]
    names = {n.worker_name(inp.ctx.name, r): r for r in wanted}
    blocked = [held[name] for name in sorted(held) if name in names]
    return [r for name, r in names.items() if name not in held], blocked


def _workers_ready(inp: PlanInput, blocked: list[PodView], creating: bool) -> _Cond:
    """WorkersReady: all Ready, or the most useful reason why not (a refused create, a name held by
    another owner, the scheduler, a stuck container, a volume that does not mount), in that order."""
    ready, total = inp.ready, inp.total
    prev = c.find(inp.old.conditions, c.WORKERS_READY)
    workers = sorted(inp.workers.values(), key=lambda p: p.rank or 0)
    if ready == total:
        return "True", Reason.ALL_WORKERS_READY, f"{ready}/{total} workers ready"
    if prev is not None and prev.reason == Reason.CREATE_FAILED and creating:
        # the API server refused a create (quota, policy): keep saying so while we retry
        return "False", Reason.CREATE_FAILED, prev.message
    if blocked:
        pod = blocked[0]
        text = (
            f"pod {pod.name} belongs to another owner (uid {pod.owner_uid}, e.g. a deleted run of the same name); "
            "waiting for it to be deleted"
        )
        return "False", Reason.NAME_CONFLICT, text
    return _not_started(inp, workers) or ("False", Reason.WAITING_FOR_WORKERS, f"{ready}/{total} workers ready")


def _not_started(inp: PlanInput, workers: list[PodView]) -> _Cond | None:
    """Why workers that exist do not start, if anyone said: the scheduler, a stuck container, a volume."""
    unsched = [p for p in workers if p.unschedulable]
    if unsched:
        text = f"{len(unsched)}/{inp.total} workers cannot be scheduled: {unsched[0].unschedulable}"
        return "False", Reason.UNSCHEDULABLE, text
    stuck = [p for p in workers if p.waiting]
    if stuck:
        return "False", Reason.CONTAINER_WAITING, f"worker {stuck[0].rank}: {stuck[0].waiting}"
    mounting = [p for p in workers if p.name in inp.mounts]
    if mounting:
        reason, message = inp.mounts[mounting[0].name]
        return "False", reason, f"worker {mounting[0].rank} (pod {mounting[0].name}): {message}"
    return None


def _launcher_state(inp: PlanInput, held: Mapping[str, PodView]) -> tuple[Phase, _Cond, bool]:
    """(phase, Running condition, create the launcher now?): the launcher is created only once every
    worker is Ready, and only under a name no other owner's pod holds."""
    launcher = inp.launcher
    if launcher is not None and launcher.phase == PodPhase.RUNNING:
        return Phase.RUNNING, ("True", Reason.LAUNCHER_RUNNING, f"launcher {launcher.name} is running mpirun"), False
    if launcher is not None:
        why = launcher.waiting or launcher.unschedulable
        text = f"launcher {launcher.name} is {launcher.phase}{f': {why}' if why else ''}"
        return Phase.STARTING, ("False", Reason.LAUNCHER_STARTING, text), False
    if inp.ready < inp.total:
        scheduled = len(inp.workers) == inp.total and all(p.scheduled for p in inp.workers.values())
        waiting: _Cond = ("False", Reason.WAITING_FOR_WORKERS, "the launcher starts once every worker is Ready")
        return (Phase.STARTING if scheduled else Phase.PENDING), waiting, False
    blocker = held.get(n.launcher_name(inp.ctx.name))
    if blocker is not None:
        text = f"pod {blocker.name} belongs to another owner (uid {blocker.owner_uid}); waiting for it to be deleted"
        return Phase.STARTING, ("False", Reason.NAME_CONFLICT, text), False
    prev = c.find(inp.old.conditions, c.RUNNING)
    if prev is not None and prev.reason == Reason.CREATE_FAILED:
        return Phase.STARTING, ("False", Reason.CREATE_FAILED, prev.message), True
    return Phase.STARTING, ("False", Reason.CREATING_LAUNCHER, "every worker is Ready; creating the launcher"), True


def _stalled(inp: PlanInput) -> tuple[_Cond, float | None]:
    """(Stalled condition, seconds until it would be) for a Running run."""
    stalled, why, wait = _no_progress(inp.old.progress, inp.run_policy, inp.now)
    if stalled:
        return ("True", Reason.NO_PROGRESS, why), wait
    return ("False", Phase.RUNNING, why), wait


def make_progress(inp: PlanInput) -> Plan:
    """Always decides: create what is missing (workers, then the launcher once all are Ready) and say
    where the run stands (WorkersReady, Running, the phase; Stalled while Running)."""
    st = inp.status()
    out = Plan(status={})
    held = {p.name: p for p in inp.foreign}
    out.create_workers, blocked = _workers_to_create(inp, held)
    workers_ready = _workers_ready(inp, blocked, bool(out.create_workers))
    phase, running, out.create_launcher = _launcher_state(inp, held)
    st.cond(c.WORKERS_READY, *workers_ready)
    st.new.phase = phase
    st.cond(c.RUNNING, *running)
    st.in_progress()
    # the conditions' messages as stored (cleaned of control characters), not the raw text from pods
    workers_text, running_text = st.message_of(c.WORKERS_READY), st.message_of(c.RUNNING)
    st.say(f"{workers_text}; {running_text}")
    if phase == Phase.RUNNING:
        stalled, out.requeue_after = _stalled(inp)
        st.cond(c.STALLED, *stalled)
        if stalled[:2] == ("True", Reason.NO_PROGRESS) and st.changed(c.STALLED):
            out.events.append(("Warning", Reason.NO_PROGRESS, st.message_of(c.STALLED)))
    if phase != inp.old.phase:
        out.events.append(("Normal", phase, st.new.message or ""))
    if workers_ready[1] in WARNED_REASONS and st.changed(c.WORKERS_READY):
        out.events.append(("Warning", workers_ready[1], workers_text))
    out.status = st.dump()
    return out


#: WorkersReady reasons that also make a Warning Event on the run when they first appear
WARNED_REASONS = (Reason.UNSCHEDULABLE, *mounts.MOUNT_REASONS)

#: The policies :func:`plan` asks, in this order; the first that returns a plan decides the pass.
POLICIES: tuple[Policy, ...] = (
    launcher_succeeded,
    launcher_aborted,
    deadline_exceeded,
    root_cause_hold,
    launcher_stopping_hold,
    gang_failure,
    stale_attempt,
    startup_deadline,
    startup_backoff,
    make_progress,
)


def _upkeep(inp: PlanInput, out: Plan) -> Plan:
    """What every pass contributes whatever decided it: pods stuck Terminating on a lost node are
    force-deleted, and the run wakes up by the earliest of its own wait, the moment a Terminating pod
    would count as stuck (a lost node sends no more events) and the active deadline."""
    out.force_delete = sorted(p.name for p in inp.own if _stuck_terminating(p, inp.now))
    waits = [_until_stuck(p, inp.now) for p in inp.own if p.terminating and p.name not in out.force_delete]
    left = inp.deadline_left
    starting = inp.startup_left  # the startup deadline's moment
    waits += [out.requeue_after, *(t for t in (left, starting) if t is not None and t > 0)]
    if mounts.waiting(inp.workers.values()):  # a failing mount sends Events only, which wake nobody
        waits.append(mounts.RECHECK_SECONDS)
    out.requeue_after = min((w for w in waits if w is not None), default=None)
    return out


def plan(
    body: Mapping[str, Any],
    ctx: RunContext,
    pods: Iterable[PodView],
    now: datetime,
    *,
    mounts: Mapping[str, tuple[Reason, str]] | None = None,
    nodes: Mapping[str, NodeState] | None = None,
) -> Plan:
    """Next status and actions for an admitted, unfinished run: the first of :data:`POLICIES` that decides
    (``mounts``: what the volume Events of waiting workers say, :func:`.mounts.failure`; ``nodes``: what the
    workers' nodes say once the launcher failed, :func:`.nodes.judge`)."""
    inp = PlanInput.of(body, ctx, pods, now, mounts=mounts, nodes=nodes)
    for policy in POLICIES:
        out = policy(inp)
        if out is not None:
            return _upkeep(inp, out)
    raise AssertionError("unreachable: make_progress, the last policy, always decides")
