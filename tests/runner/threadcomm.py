"""Simulated ranks for in-process tests: one thread per rank, collectives through shared slots.

:class:`ThreadCommunicator` is a real ``size``-rank :class:`Communicator` (all-reduce, broadcast, all-gather,
barrier) between threads of this process; :func:`on_ranks` runs a body on every rank and hands back the
results in rank order. No process is started: the tests that use it stay in the unit layer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from mlbench_runner.comm import Communicator, CountingCommunicator

T = TypeVar("T")

#: how long a rank waits at a collective for the others before the test fails (a rank that died aborts sooner)
BARRIER_TIMEOUT_SECONDS = 60


class ThreadGroup:
    """``size`` ranks' shared slots and the barrier they meet at."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=BARRIER_TIMEOUT_SECONDS)
        self.slots: list[torch.Tensor | None] = [None] * size

    def share(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (a copy), in rank order, once all have handed theirs in."""
        self.slots[rank] = tensor.detach().clone()
        self.barrier.wait()
        everyone = [t for t in self.slots if t is not None]
        self.barrier.wait()  # all have read before anyone writes the next collective's slot
        return everyone


class ThreadCommunicator(Communicator):
    """Rank ``rank`` of a :class:`ThreadGroup`: sums in rank order, in the tensor's own dtype (int8 wraps)."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.size, self.name = group, rank, group.size, "threads"

    def all_reduce_sum_(self, tensor: torch.Tensor) -> None:
        parts = self.group.share(self.rank, tensor)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        tensor.copy_(total)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        tensor.copy_(self.group.share(self.rank, tensor)[src])

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.stack(self.group.share(self.rank, tensor))

    def exchange(self, tensor: torch.Tensor, peers: Sequence[int]) -> list[torch.Tensor]:
        raise NotImplementedError("no test of the thread ranks exchanges with peers")

    def barrier(self) -> None:
        self.group.barrier.wait()


def on_ranks(size: int, body: Callable[[int, CountingCommunicator], T]) -> list[T]:
    """Run ``body(rank, comm)`` in ``size`` threads; return the results in rank order (re-raising failures)."""
    group = ThreadGroup(size)
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank, CountingCommunicator(ThreadCommunicator(group, rank)))
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BARRIER_TIMEOUT_SECONDS * 2)
    if errors:
        raise errors[0]
    return results
