"""The last policy, which always decides: create what is missing (workers, then the launcher once all are
Ready) and say where the run stands (WorkersReady, Running, the phase; Stalled when the step counter stops).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from mlbench_api.runpolicy import RunPolicy
from mlbench_api.runstatus import Phase, Progress
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodPhase, PodView
from mlbench_operator.run import mounts
from mlbench_operator.run.planinput import PlanInput
from mlbench_operator.run.status import Plan, _Cond

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


WARNED_REASONS = (Reason.UNSCHEDULABLE, *mounts.MOUNT_REASONS)
