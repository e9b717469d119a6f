"""The policies that decide nothing for a while: a failed launcher's workers may still report the real cause (or
their node is late), a running launcher that is being deleted stops its ranks first.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from mlbench_operator import conditions as c
from mlbench_operator.podview import PodPhase, PodView
from mlbench_operator.run import nodes
from mlbench_operator.run.outcome import _root_cause_wait
from mlbench_operator.run.planinput import PlanInput
from mlbench_operator.run.status import Plan


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
