"""The policies of a new attempt: a failed gang restarts (or gives up), the previous attempt's pods go first,
an attempt that does not start in time is released and retried after a backoff (:mod:`.startup`).
"""

from __future__ import annotations

from datetime import timedelta

from mlbench_api.runstatus import Phase, WorkerCounts
from mlbench_operator import conditions as c
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodPhase
from mlbench_operator.run import nodes, startup
from mlbench_operator.run.finishing import _finished
from mlbench_operator.run.lifecycle import _deletable
from mlbench_operator.run.outcome import PERMANENT_FAILURES, _find_failure, world_disruption
from mlbench_operator.run.planinput import PlanInput
from mlbench_operator.run.status import Plan


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
