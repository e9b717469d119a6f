"""Create slots shared fairly: the pure turn order (:class:`FairQueue`), the slots, and Kube's creates."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from kubernetes import client as k8s

from mlbench_operator import naming as n
from mlbench_operator.fairshare import FairQueue, FairSlots
from mlbench_operator.kube import Kube, create_owner

# (waiters pushed in this order as (namespace, run, waiter), the order pop serves them)
TURNS = [
    pytest.param([("a", "r", 1), ("a", "r", 2)], [1, 2], id="one-run-fifo"),
    pytest.param([("a", "big", 1), ("a", "big", 2), ("a", "big", 3), ("b", "small", 9)], [1, 9, 2, 3], id="namespaces"),
    pytest.param(
        [("a", "r1", 1), ("a", "r1", 2), ("a", "r2", 3), ("a", "r2", 4)], [1, 3, 2, 4], id="runs-in-namespace"
    ),
    pytest.param(
        # ten runs in namespace a, one in b: b gets every other slot, not one in eleven
        [("a", f"r{i}", i) for i in range(10)] + [("a", f"r{i}", 10 + i) for i in range(10)] + [("b", "s", 99)],
        [0, 99, 1, 2, 3],
        id="namespace-before-run",
    ),
    pytest.param([("a", "x", 1), ("b", "y", 2), ("c", "z", 3), ("a", "x", 4)], [1, 2, 3, 4], id="round-robin"),
]


@pytest.mark.parametrize(("pushed", "served"), TURNS)
def test_turn_order(pushed: list[tuple[str, str, int]], served: list[int]) -> None:
    queue: FairQueue[int] = FairQueue()
    for namespace, run, waiter in pushed:
        queue.push((namespace, run), waiter)
    assert [queue.pop() for _ in served] == served


def test_an_empty_queue_serves_nobody_and_removal_forgets() -> None:
    queue: FairQueue[int] = FairQueue()
    assert queue.pop() is None
    queue.push(("a", "r"), 1)
    queue.push(("b", "s"), 2)
    queue.remove(("a", "r"), 1)
    queue.remove(("a", "r"), 7)  # never waited: nothing happens
    assert len(queue) == 1
    assert queue.pop() == 2
    assert queue.pop() is None


def test_slots_bound_the_holders_and_a_cancelled_waiter_gives_its_turn_on() -> None:
    async def scenario() -> tuple[int, list[str]]:
        slots = FairSlots(2)
        peak, inside, order = 0, 0, []

        async def hold(owner: tuple[str, str], tag: str) -> None:
            nonlocal peak, inside
            async with slots.hold(owner):
                inside += 1
                peak = max(peak, inside)
                order.append(tag)
                await asyncio.sleep(0.01)
                inside -= 1

        tasks = [asyncio.create_task(hold(("a", "big"), f"a{i}")) for i in range(6)]
        await asyncio.sleep(0)
        doomed = asyncio.create_task(hold(("c", "gone"), "never"))
        tasks.append(asyncio.create_task(hold(("b", "small"), "b")))
        await asyncio.sleep(0)
        doomed.cancel()
        await asyncio.gather(*tasks)
        assert slots.free == 2
        return peak, order

    peak, order = asyncio.run(scenario())
    assert peak == 2
    assert "never" not in order
    assert order.index("b") <= 3  # the first freed slot after it asked, not after a0..a5


def test_slots_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairSlots(0)


def _pod(namespace: str, run: str, rank: int) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": f"{run}-w{rank}", "labels": {n.LABEL_RUN: run}}}


def test_create_owner_is_the_namespace_and_run() -> None:
    assert create_owner(_pod("a", "big", 3)) == ("a", "big")
    assert create_owner({"metadata": {"namespace": "a", "name": "cm"}}) == ("a", "cm")
    assert create_owner({}) == ("", "")


@pytest.mark.parametrize("runs_in_a", [1, 10])
def test_a_big_tenant_does_not_starve_a_small_one(runs_in_a: int) -> None:
    """300 creates of namespace a (one run, or ten runs of 30) asked first, then a 2-worker run of namespace b:
    b's creates are served among the first few, not after a's whole world (the thread pool alone is FIFO)."""
    kube = Kube(k8s.Configuration(), concurrency=16)
    created: list[str] = []
    lock = threading.Lock()

    def create(obj: dict[str, Any]) -> bool:
        time.sleep(0.002)
        with lock:
            created.append(obj["metadata"]["namespace"])
        return True

    kube.create = create  # type: ignore[method-assign]
    per_run = 300 // runs_in_a
    big = [kube.create_many([_pod("a", f"r{i}", k) for k in range(per_run)]) for i in range(runs_in_a)]

    async def tenants() -> None:
        first = [asyncio.ensure_future(c) for c in big]
        await asyncio.sleep(0)  # a's creates are all asked for before b's
        await asyncio.gather(*first, kube.create_many([_pod("b", "small", k) for k in range(2)]))

    try:
        asyncio.run(asyncio.wait_for(tenants(), timeout=60))
    finally:
        kube.close()
    assert len(created) == 302
    last_b = max(i for i, ns in enumerate(created) if ns == "b")
    assert last_b < 50, f"b's last create was number {last_b + 1} of {len(created)}"
