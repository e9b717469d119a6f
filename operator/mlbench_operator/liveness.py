"""Liveness by progress: is the operator's API pool finishing calls while it has work?

The probe used to time a no-op queued on the pool: behind a fan-out of 1000 pod creations that measures the
queue's depth, and a busy operator was restarted in the middle of its work. What matters is progress: while
calls are queued or running, one must complete (an answer or an error: the transport's timeouts end every
call) every :data:`STALL_SECONDS`. An idle pool is alive however long ago its last call was.

:class:`Progress` is the thread-safe meter :class:`.kube.Kube` feeds; :func:`verdict` the pure decision.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Longest time with work queued and no call completed. Every request has a 5 s connect and 30 s read
#: timeout, so a healthy pool completes something well within this even when every thread waits on a slow call.
STALL_SECONDS = 120.0


@dataclass(frozen=True)
class Snapshot:
    """Calls submitted and not finished (queued or running), and since when the pool has had nothing
    completed while busy: the later of its last completion and the moment work arrived at an idle pool."""

    pending: int
    since: float


def verdict(snapshot: Snapshot, now: float, limit: float = STALL_SECONDS) -> str | None:
    """None: alive. Otherwise why not (the probe fails with it)."""
    if snapshot.pending <= 0:
        return None
    waited = now - snapshot.since
    if waited <= limit:
        return None
    return f"{snapshot.pending} API calls waiting and none completed for {waited:.0f}s (limit {limit:.0f}s): stuck"


class Progress:
    """Counts a pool's calls in and out (thread-safe; ``clock``: monotonic seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pending = 0
        self._since = clock()

    def started(self) -> None:
        with self._lock:
            if self._pending == 0:  # work arrives at an idle pool: the wait counts from now
                self._since = self._clock()
            self._pending += 1

    def finished(self) -> None:
        with self._lock:
            self._pending = max(0, self._pending - 1)
            self._since = self._clock()

    def now(self) -> float:
        """The meter's clock (what a :class:`Snapshot`'s ``since`` is measured on)."""
        return self._clock()

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(self._pending, self._since)
