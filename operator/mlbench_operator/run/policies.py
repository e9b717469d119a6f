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

The policies live by family: :mod:`.finishing` (1-3: the run ends), :mod:`.holding` (4 and the launcher
being stopped: decide nothing yet), :mod:`.restarting` (5-8: a new attempt), :mod:`.progressing` (9); what they
decide from is :class:`.planinput.PlanInput`.

The order is the precedence: a result beats the deadline (the run did finish), the deadline
beats a failure (no restart past it), a worker's cause beats the launcher's echo of it, and a failure
beats the startup clock (a pod that failed is a failure, not a slow start). Whatever decides, every pass
also force-deletes pods stuck Terminating on a lost node and wakes up by the earliest wait (:func:`_upkeep`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodView
from mlbench_operator.run import mounts
from mlbench_operator.run.finishing import deadline_exceeded, launcher_aborted, launcher_succeeded
from mlbench_operator.run.holding import launcher_stopping_hold, root_cause_hold
from mlbench_operator.run.lifecycle import _stuck_terminating, _until_stuck
from mlbench_operator.run.nodes import NodeState
from mlbench_operator.run.planinput import PlanInput, Policy
from mlbench_operator.run.progressing import make_progress
from mlbench_operator.run.restarting import gang_failure, stale_attempt, startup_backoff, startup_deadline
from mlbench_operator.run.status import Plan
from mlbench_operator.runcontext import RunContext

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
