"""Who gets the next create slot: fair between namespaces first, then between the runs of a namespace.

Every run's daemon issues its pods' creates on the operator's one API thread pool, which serves calls in the
order they were asked for. A 1000-worker run asks for 1000 creates at once, and a 2-worker run of another
tenant asked a moment later waited behind all of them. So creates go through a fixed number of slots
(``MLBENCH_CREATE_SLOTS``) and a freed slot goes to the next waiting namespace in turn (round robin), and
within it to the next waiting run in turn: a small run waits for at most a few creates per other tenant,
never for another tenant's whole world.

:class:`FairQueue` is the policy, pure (a table test: tests/operator/test_fairshare.py); :class:`FairSlots`
is its asyncio glue (:meth:`.kube.Kube.create_many` holds a slot for each create).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

#: ``MLBENCH_CREATE_SLOTS`` default: creates in flight at once, all runs together; as many as the API pool's
#: threads (:class:`.kube.Kube`), the creates in flight measured for the 1000-worker run (docs/operator.md,
#: "Scale"). A read or status write of another run then waits for at most one create, never for a queue.
CREATE_SLOTS = 16

#: A waiter's owner: (namespace, run).
Owner = tuple[str, str]
W = TypeVar("W", bound=Hashable)


class FairQueue(Generic[W]):
    """Waiters by (namespace, run); :meth:`pop` takes them round robin, namespaces first, then runs."""

    def __init__(self) -> None:
        #: namespace -> run -> waiters (FIFO); both levels in turn order (the next to serve first).
        self._queues: OrderedDict[str, OrderedDict[str, deque[W]]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(q) for runs in self._queues.values() for q in runs.values())

    def push(self, owner: Owner, waiter: W) -> None:
        """``waiter`` waits for a slot on behalf of ``owner``; a new namespace or run joins at the end of the turn."""
        namespace, run = owner
        self._queues.setdefault(namespace, OrderedDict()).setdefault(run, deque()).append(waiter)

    def pop(self) -> W | None:
        """The next waiter to serve (None: nobody waits): the first run of the first namespace in turn; both
        then go to the end of their turn (a namespace or run with nobody left waiting leaves it)."""
        if not self._queues:
            return None
        namespace, runs = next(iter(self._queues.items()))
        run, waiters = next(iter(runs.items()))
        waiter = waiters.popleft()
        runs.move_to_end(run)
        if not waiters:
            del runs[run]
        self._queues.move_to_end(namespace)
        if not runs:
            del self._queues[namespace]
        return waiter

    def remove(self, owner: Owner, waiter: W) -> None:
        """``waiter`` stopped waiting (cancelled) before it was served."""
        namespace, run = owner
        waiters = self._queues.get(namespace, OrderedDict()).get(run)
        if waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        if not waiters:
            del self._queues[namespace][run]
        if not self._queues[namespace]:
            del self._queues[namespace]


class FairSlots:
    """``slots`` holders at once; a freed slot goes to :class:`FairQueue`'s next waiter."""

    def __init__(self, slots: int = CREATE_SLOTS) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots}")
        self.free = slots
        self.waiting: FairQueue[asyncio.Future[None]] = FairQueue()

    @asynccontextmanager
    async def hold(self, owner: Owner) -> AsyncIterator[None]:
        """Wait for a slot for ``owner`` (a free one at once while nobody waits), hold it for the block."""
        if self.free > 0 and not len(self.waiting):
            self.free -= 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiting.push(owner, turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release()  # handed a slot as it was cancelled: pass it on
                else:
                    self.waiting.remove(owner, turn)
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        """A slot is free: hand it to the next waiter in turn (it stays taken), else keep it."""
        while (turn := self.waiting.pop()) is not None:
            if not turn.done():
                turn.set_result(None)
                return
        self.free += 1
