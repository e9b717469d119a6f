"""The policies that end a run: the launcher succeeded (its result), the run aborted, the active deadline passed."""

from __future__ import annotations

from mlbench_api.runstatus import Phase
from mlbench_operator import conditions as c
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodPhase
from mlbench_operator.run.lifecycle import _cleanup, end_policy
from mlbench_operator.run.outcome import final_progress, parse_summary, summary_result
from mlbench_operator.run.planinput import PlanInput
from mlbench_operator.run.status import Plan, _short, _Status


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
