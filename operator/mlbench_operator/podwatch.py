"""The operator's pods, listed and watched on a thread into a PodIndex; each change wakes its run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any

from mlbench_operator import logs
from mlbench_operator import metrics as m
from mlbench_operator import naming as n
from mlbench_operator.kube import ApiError, Kube
from mlbench_operator.podview import PodChange, PodIndex
from mlbench_operator.runtime import Wakeups

log = logs.get_logger()


# -- observations ----------------------------------------------------------------------------------------
#: The operator's pods (server-side filtered: not every pod of the cluster).
POD_SELECTOR = f"{n.LABEL_MANAGED_BY}={n.MANAGER},{n.LABEL_RUN}"


#: Waits before listing again after a failed listing or watch: doubling from the first, up to the last.
POD_WATCH_BACKOFF = (1.0, 30.0)


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class PodWatch:
    """The operator's pods in a namespace (None: all), listed then watched on a thread of its own into a
    :class:`PodIndex`; every change wakes its run's daemon.

    Why not kopf's ``@kopf.index`` and ``@kopf.on.event`` on pods: kopf takes every watch event through
    its per-object machinery (a worker task, memories, loggers, cause detection, handler invocation):
    about 0.5 ms of the event loop's CPU per event, decoding aside, and a run of 1000 workers brings
    3000 events (created, scheduled, Running) while the same loop and its API threads are creating
    those pods. Here an event costs its decoding and a :class:`PodView` (about 0.08 ms), done on this
    thread, and the loop only files the change (docs/operator.md, "Scale").

    The same guarantees as kopf's index: the first listing is in the index before :attr:`synced` is set
    (``configure`` waits for it, and kopf starts the run daemons after it), a lost watch is resumed from
    its last resourceVersion, and an expired one (410) or a failure lists again, which also drops the
    pods deleted meanwhile.
    """

    def __init__(
        self,
        kube: Kube,
        index: PodIndex,
        wakeups: Wakeups,
        loop: asyncio.AbstractEventLoop,
        *,
        namespace: str | None,
        timeout_seconds: int = 300,
    ) -> None:
        self.kube = kube
        self.index = index
        self.wakeups = wakeups
        self.loop = loop
        self.namespace = namespace
        self.path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        self.timeout_seconds = timeout_seconds
        #: Set (on the loop) once the first listing is in the index.
        self.synced = asyncio.Event()
        #: The HTTP status of the latest failed listing or watch (0: no answer), None once a listing succeeds
        #: again: a namespace's health (:func:`.nsready.health`). Written on the thread, read on the loop.
        self.error: int | None = None
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"pod-watch-{namespace or 'all'}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the watch (the thread ends at its next event, or now when its stream is shut down)."""
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                changes, version = self._list()
                self.error = None  # before the loop hears of the listing: synced and no error, at once
                self._hand(changes, listing=True)
                failures = 0
                while not self._stop.is_set():  # the server ends a watch after timeout_seconds: resume it
                    version = self._follow(version)
            except _Expired:
                log.info("pod_watch_expired", namespace=self.namespace)
            except Exception as err:
                if self._stop.is_set():
                    return
                failures += 1
                self.error = err.status if isinstance(err, ApiError) else 0
                delay = min(POD_WATCH_BACKOFF[0] * 2 ** (failures - 1), POD_WATCH_BACKOFF[1])
                log.warning("pod_watch_failed", namespace=self.namespace, error=str(err)[:500], retry_in=delay)
                self._stop.wait(delay)

    def _list(self) -> tuple[list[PodChange], str]:
        """Every operator pod, page by page: each page's pods become small views before the next is fetched."""
        changes: list[PodChange] = []
        version = ""
        for pods, page_version in self.kube.pages(self.path, [("labelSelector", POD_SELECTOR)], "pods"):
            version = page_version
            changes.extend(c for c in (PodChange.of("ADDED", p) for p in pods) if c is not None)
        return changes, version

    def _follow(self, version: str) -> str:
        """One watch from ``version``; returns the last resourceVersion seen when the server ends it."""
        for events in self.kube.watch(
            self.path, POD_SELECTOR, version, self.timeout_seconds, resource="pods", on_response=self._keep
        ):
            changes: list[PodChange] = []
            for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired
                    raise ApiError(int(obj.get("code") or 500), "WATCH", self.path, json.dumps(obj))
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                change = PodChange.of(str(kind), obj) if kind != "BOOKMARK" else None
                if change is not None:
                    changes.append(change)
            if changes:
                _POD_EVENTS.inc(len(changes))
                self._hand(changes)
            if self._stop.is_set():
                break
        return version

    def _keep(self, response: Any) -> None:
        self._response = response
        if self._stop.is_set():  # stopped while connecting
            with contextlib.suppress(Exception):
                response.shutdown()

    def _hand(self, changes: list[PodChange], listing: bool = False) -> None:
        """To the loop, which owns the index and the wake-ups (raises once the loop is closed: the thread ends)."""
        self.loop.call_soon_threadsafe(self.apply, changes, listing)

    def apply(self, changes: list[PodChange], listing: bool = False) -> None:
        """On the loop: file the changes (a listing replaces the namespace's pods), wake the runs they touch."""
        if listing:
            touched = self.index.reset(changes, self.namespace)
        else:
            touched = set()
            for change in changes:
                touched |= self.index.update(change)
        for key in touched:
            self.wakeups.wake(key)
        self.synced.set()


_POD_EVENTS = m.WATCH_EVENTS.labels("pods")
