"""The operator's pod index and the watch that feeds it, without a cluster (a scripted API)."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest

from mlbench_operator import podwatch, runpods
from mlbench_operator.podview import PodChange, PodIndex
from tests.operator import helpers as h
from tests.operator.test_reconcile import admitted


def _pod(rank: int, uid: str, phase: str = "Pending", version: str = "1", run: str = "r1") -> dict[str, Any]:
    """A worker pod of run ``run`` in namespace ns, as the watch sends it."""
    _, ctx = admitted(h.run(run))
    obj = runpods.worker_pod(ctx, rank, 0)
    obj["metadata"].update(uid=uid, resourceVersion=version)
    obj["status"] = {"phase": phase}
    return obj


def test_changes_file_pods_by_run() -> None:
    index = PodIndex()
    added = PodChange.of("ADDED", _pod(0, "u0"))
    assert added is not None
    assert added.key == ("ns", "r1")
    assert index.update(added) == {("ns", "r1")}
    running = PodChange.of("MODIFIED", _pod(0, "u0", "Running"))
    assert running is not None
    index.update(running)
    assert [p.phase for p in index.get(("ns", "r1"))] == ["Running"]  # replaced, not added
    other = PodChange.of("ADDED", _pod(0, "v0", run="r2"))
    assert other is not None
    index.update(other)
    assert len(index) == 2
    deleted = PodChange.of("DELETED", _pod(0, "u0", "Running"))
    assert deleted is not None
    assert index.update(deleted) == {("ns", "r1")}
    assert index.get(("ns", "r1")) == []
    assert index.get(("ns", "gone"), ["default"]) == ["default"]  # type: ignore[list-item]


def test_pods_that_are_no_runs_are_dropped() -> None:
    """A pod relabelled out of its run (or never a run's worker/launcher) leaves the index, and wakes the run."""
    index = PodIndex()
    pod = _pod(0, "u0")
    change = PodChange.of("ADDED", pod)
    assert change is not None
    index.update(change)
    pod["metadata"]["labels"].pop("mlbench.io/role")
    relabelled = PodChange.of("MODIFIED", pod)
    assert relabelled == PodChange("u0")
    assert index.update(relabelled) == {("ns", "r1")}
    assert len(index) == 0
    assert PodChange.of("ADDED", {"metadata": {"name": "no-uid"}}) is None


def test_a_listing_replaces_its_namespace_only() -> None:
    """After a relist: exactly the listed pods (deletions missed meanwhile are dropped) of that namespace;
    the runs whose pods differ are the ones to wake."""
    index = PodIndex()
    for rank in range(2):
        change = PodChange.of("ADDED", _pod(rank, f"u{rank}"))
        assert change is not None
        index.update(change)
    elsewhere = _pod(0, "x0")
    elsewhere["metadata"]["namespace"] = "other"
    change = PodChange.of("ADDED", elsewhere)
    assert change is not None
    index.update(change)
    same = PodChange.of("ADDED", _pod(0, "u0"))
    assert same is not None
    assert index.reset([same], namespace="ns") == {("ns", "r1")}  # u1 is gone
    assert [p.rank for p in index.get(("ns", "r1"))] == [0]
    assert len(index.get(("other", "r1"))) == 1
    assert index.reset([same], namespace="ns") == set()  # nothing changed: nobody to wake
    assert index.reset([]) == {("ns", "r1"), ("other", "r1")}  # a cluster-wide listing
    assert len(index) == 0


class _Wakeups:
    def __init__(self) -> None:
        self.woken: list[tuple[str, str]] = []

    def wake(self, key: tuple[str, str]) -> None:
        self.woken.append(key)


class _ScriptedKube:
    """pages answers from ``listings`` (a page a pod); each watch plays the next script (batches of events, or an
    exception), then, with none left, blocks until released."""

    def __init__(self, listings: list[Any], watches: list[Any]) -> None:
        self.listings = deque(listings)
        self.watches = deque(watches)
        self.calls: list[tuple[str, str]] = []
        self.released = threading.Event()

    def pages(
        self, path: str, query: list[tuple[str, str]], resource: str
    ) -> Iterator[tuple[list[dict[str, Any]], str]]:
        """A listing (pods, version) served in pages of one pod (at least one page, as the API server does)."""
        self.calls.append(("list", path))
        item = self.listings.popleft()
        if isinstance(item, Exception):
            raise item
        pods, version = item
        for i in range(max(1, len(pods))):
            yield pods[i : i + 1], version

    def watch(
        self, path: str, selector: str, version: str, timeout: int, *, resource: str, on_response: Any = None
    ) -> Iterator[list[dict[str, Any]]]:
        self.calls.append(("watch", version))
        if not self.watches:
            self.released.wait(10)
            return
        script = self.watches.popleft()
        if isinstance(script, Exception):
            raise script
        yield from script


def _event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def test_the_watch_resumes_relists_and_wakes(monkeypatch: pytest.MonkeyPatch) -> None:
    """List, watch from the listing, resume from the last version (a bookmark's too) when the server ends
    the stream, list again on 410 Gone and after a failure; every change wakes its run."""

    monkeypatch.setattr(podwatch, "POD_WATCH_BACKOFF", (0.01, 0.01))
    watch_class: Any = podwatch.PodWatch  # given stand-ins for the Kube and the Wakeups
    kube = _ScriptedKube(
        listings=[([_pod(0, "u0", version="10")], "10"), RuntimeError("apiserver down"), ([_pod(1, "u1")], "30")],
        watches=[
            [
                [_event("MODIFIED", _pod(0, "u0", "Running", "11"))],
                [_event("BOOKMARK", {"metadata": {"resourceVersion": "12"}})],
            ],
            [[_event("ERROR", {"code": 410, "message": "too old resource version"})]],
        ],
    )

    async def scenario() -> tuple[_Wakeups, list[Any]]:
        index, wakeups = PodIndex(), _Wakeups()
        watch = watch_class(
            kube,
            index,
            wakeups,
            asyncio.get_running_loop(),
            namespace="ns",
            timeout_seconds=5,
        )
        watch.start()
        await asyncio.wait_for(watch.synced.wait(), 5)
        for _ in range(500):  # until the last watch (from the second listing) is open
            if kube.calls[-1:] == [("watch", "30")]:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the listing's changes, handed to the loop
        watch.stop()
        kube.released.set()
        watch._thread.join(5)
        assert not watch._thread.is_alive()
        return wakeups, index.get(("ns", "r1"))

    wakeups, pods = asyncio.run(scenario())
    assert kube.calls == [
        ("list", "/api/v1/namespaces/ns/pods"),
        ("watch", "10"),
        ("watch", "12"),  # resumed from the bookmark
        ("list", "/api/v1/namespaces/ns/pods"),  # 410: list again; it fails
        ("list", "/api/v1/namespaces/ns/pods"),  # and again after the backoff
        ("watch", "30"),
    ]
    assert [(p.name, p.phase) for p in pods] == [("r1-worker-1", "Pending")]  # u0 was deleted meanwhile
    assert wakeups.woken == [("ns", "r1")] * 3  # the listing, u0 Running, the relisting


def test_a_cluster_wide_watch_lists_every_namespace() -> None:

    watch_class: Any = podwatch.PodWatch
    kube = _ScriptedKube(listings=[([], "5")], watches=[])

    async def scenario() -> None:
        watch = watch_class(
            kube,
            PodIndex(),
            _Wakeups(),
            asyncio.get_running_loop(),
            namespace=None,
        )
        watch.start()
        await asyncio.wait_for(watch.synced.wait(), 5)  # an empty listing is a listing too
        watch.stop()
        kube.released.set()
        watch._thread.join(5)

    asyncio.run(scenario())
    assert kube.calls[0] == ("list", "/api/v1/pods")


def test_a_refused_listing_is_the_watchs_error_until_a_listing_succeeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The namespace gate (nsgate) reads ``error``: a 403 (the namespace's RoleBinding missing) is kept, and the
    first listing that succeeds again clears it."""
    from mlbench_operator.kube import ApiError

    monkeypatch.setattr(podwatch, "POD_WATCH_BACKOFF", (0.05, 0.05))
    watch_class: Any = podwatch.PodWatch
    kube = _ScriptedKube(listings=[ApiError(403, "GET", "/pods", "forbidden"), ([], "7")], watches=[])

    async def scenario() -> list[int | None]:
        watch = watch_class(kube, PodIndex(), _Wakeups(), asyncio.get_running_loop(), namespace="team-b")
        seen: list[int | None] = [watch.error]
        watch.start()
        for _ in range(100):
            if watch.error is not None:
                break
            await asyncio.sleep(0.005)
        seen.append(watch.error)
        await asyncio.wait_for(watch.synced.wait(), 5)
        seen.append(watch.error)
        watch.stop()
        kube.released.set()
        watch._thread.join(5)
        return seen

    assert asyncio.run(scenario()) == [None, 403, None]
