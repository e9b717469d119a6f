"""Workers that wait for a volume: the kubelet says why only in Events (``FailedMount``, ``FailedAttachVolume``),
never in the pod's status, which shows ``ContainerCreating`` for as long as the mount fails. A run whose workers
cannot mount their data (a missing ConfigMap or Secret, a ReadWriteOnce claim already attached to another node,
an NFS server that does not answer) would wait in silence; the operator reads the Events of a few workers that
have been scheduled and Pending for a while, and ``WorkersReady`` says what the kubelet said.

Pure: which pods to ask about, and what their Events mean. The executor makes the calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from mlbench_operator import conditions as c
from mlbench_operator.podview import PodPhase, PodView

#: The kubelet's and the attach/detach controller's Event reasons for a volume that does not come.
MOUNT_REASONS = (c.Reason.FAILED_MOUNT, c.Reason.FAILED_ATTACH_VOLUME)
#: A worker Pending this long after its creation (and scheduled) is asked about: a mount takes a moment.
CHECK_AFTER_SECONDS = 10.0
#: Workers asked about per pass, at most (the first by rank): one message is enough, and a 1000-worker run
#: must not list Events 1000 times a pass.
CHECK_PODS = 3
#: While a worker waits scheduled and Pending, the run looks again this often (Events wake nobody).
RECHECK_SECONDS = 10.0


def waiting(workers: Iterable[PodView]) -> list[PodView]:
    """Workers that are scheduled but not started: they may be waiting for a volume."""
    return [
        p
        for p in workers
        if p.phase == PodPhase.PENDING and p.scheduled and not p.waiting and not p.terminating and not p.ready
    ]


def to_check(workers: Iterable[PodView], now: datetime) -> list[PodView]:
    """The workers whose Events to read this pass: waiting for :data:`CHECK_AFTER_SECONDS` at least."""
    due = [p for p in waiting(workers) if _age(p, now) >= CHECK_AFTER_SECONDS]
    return sorted(due, key=lambda p: p.rank or 0)[:CHECK_PODS]


def _age(pod: PodView, now: datetime) -> float:
    created = c.parse_time(pod.created)
    return (now - created).total_seconds() if created is not None else 0.0


def field_selector(pod: PodView) -> str:
    """The Events of this very pod (its UID: a name repeats across attempts) that are warnings."""
    return f"involvedObject.uid={pod.uid},type=Warning"


def failure(events: Sequence[Mapping[str, Any]]) -> tuple[c.Reason, str] | None:
    """``(reason, message)`` of the latest volume Event among ``events``, or None."""
    found = [e for e in events if e.get("reason") in MOUNT_REASONS]
    if not found:
        return None
    latest = max(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return c.Reason(latest["reason"]), str(latest.get("message") or "")
