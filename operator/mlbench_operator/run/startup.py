"""The all-or-nothing start's clock: pure decisions of ``runPolicy.startupDeadlineSeconds`` (Kueue's
``waitForPodsReady``, JobSet's startup policy).

An attempt has started once every worker is Ready and its launcher runs (or has already ended). Until then its
clock counts from the creation of its first pod; past the deadline :mod:`.restarting` releases the attempt's pods
and either starts a new attempt after :func:`backoff` or fails the run. This module only answers the questions:
when did the attempt's clock start (:func:`clock_start`), how long is left (:func:`left`), why are its pods
not ready (:func:`blockers`), how long to wait before the next attempt (:func:`backoff`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime

from mlbench_api.runpolicy import STARTUP_BACKOFF_MAX_SECONDS, RunPolicy
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodPhase, PodView

#: ``runPolicy.startupDeadlineSeconds`` when unset: ten minutes from the first pod to a running launcher.
STARTUP_DEADLINE_SECONDS = 600

#: Pods named in a blockers summary (the counts cover them all).
NAMED_PODS = 3


def deadline(policy: RunPolicy) -> int:
    """The startup deadline in seconds (:data:`STARTUP_DEADLINE_SECONDS` when unset)."""
    return policy.startup_deadline_seconds or STARTUP_DEADLINE_SECONDS


def started(launcher: PodView | None) -> bool:
    """The attempt has started: its launcher exists and has left Pending (running, or already ended or being
    deleted: then the failure, the result or the gang restart decides, not the clock)."""
    return launcher is not None and launcher.phase != PodPhase.PENDING


def clock_start(pods: Iterable[PodView]) -> datetime | None:
    """When the attempt's clock started: the creation of its earliest pod still there (None: no pod yet, or
    none with a creation time: no clock, nothing is held)."""
    times = [t for t in (c.parse_time(p.created) for p in pods if not p.terminating) if t is not None]
    return min(times, default=None)


def left(policy: RunPolicy, pods: Iterable[PodView], launcher: PodView | None, now: datetime) -> float | None:
    """Seconds until the attempt's startup deadline (<= 0: passed); None when it does not apply (started, or
    no pod created yet)."""
    if started(launcher):
        return None
    since = clock_start(pods)
    if since is None:
        return None
    return deadline(policy) - (now - since).total_seconds()


def why_not_ready(pod: PodView, mounts: Mapping[str, tuple[Reason, str]]) -> tuple[str, str]:
    """``(reason, detail)`` of one pod that is not ready, in the pod's own words: the scheduler's
    (Unschedulable), a container's waiting reason (ImagePullBackOff, ErrImagePull, ...), a volume's Event
    (FailedMount, FailedAttachVolume); else what is known (Pending, Running but not Ready)."""
    if pod.unschedulable:
        return Reason.UNSCHEDULABLE, pod.unschedulable
    if pod.waiting:
        reason, _, detail = pod.waiting.partition(": ")
        return reason, detail
    if pod.name in mounts:
        reason, message = mounts[pod.name]
        return reason, message
    if pod.phase == PodPhase.RUNNING:
        return "NotReady", "running, not Ready"
    return str(pod.phase), "no reason reported" if pod.scheduled else "not scheduled yet"


def _who(pod: PodView) -> str:
    return "launcher" if pod.role == n.ROLE_LAUNCHER else f"worker {pod.rank}"


def blockers(
    workers: Mapping[int, PodView],
    launcher: PodView | None,
    total: int,
    mounts: Mapping[str, tuple[Reason, str]],
) -> str:
    """One line saying why the attempt has not started: the count of each reason, most common first, then the
    first pods' own words, e.g. ``2/4 workers not ready (Unschedulable: 2); worker 1 (pod r-worker-1):
    Unschedulable: 0/3 nodes are available: 3 Insufficient cpu``."""
    stuck = [p for _, p in sorted(workers.items()) if not p.ready or p.terminating]
    if launcher is not None and not started(launcher):
        stuck.append(launcher)
    found = [(p, *why_not_ready(p, mounts)) for p in stuck]
    counts = Counter(reason for _, reason, _ in found)
    missing = total - len(workers)
    if missing > 0:
        counts["NotCreated"] = missing
    tally = ", ".join(f"{reason}: {count}" for reason, count in counts.most_common())
    not_ready = sum(1 for p in stuck if p.role == n.ROLE_WORKER) + max(missing, 0)
    head = f"{not_ready}/{total} workers not ready"
    if launcher is None and not_ready == 0:
        head = "the launcher was not created"
    elif launcher is not None and not started(launcher):
        head += ", the launcher not running"
    named = "; ".join(f"{_who(p)} (pod {p.name}): {reason}: {detail}" for p, reason, detail in found[:NAMED_PODS])
    return f"{head} ({tally})" + (f"; {named}" if named else "") if tally else head


def backoff(policy: RunPolicy, timeouts: int) -> int:
    """Seconds to wait before the attempt after the ``timeouts``-th startup timeout (1 for the first):
    ``startupBackoffSeconds`` doubled for each further one, at most :data:`STARTUP_BACKOFF_MAX_SECONDS`."""
    base = policy.startup_backoff_seconds
    if base == 0 or timeouts < 1:
        return 0
    return min(base * 2 ** min(timeouts - 1, 32), STARTUP_BACKOFF_MAX_SECONDS)


def retry_wait(retry_at: datetime | None, now: datetime) -> float | None:
    """Seconds still to wait before the next attempt may create its pods; None when it may now."""
    if retry_at is None:
        return None
    wait = (retry_at - now).total_seconds()
    return wait if wait > 0 else None
