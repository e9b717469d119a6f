"""The floor both resources' daemons stand on: the configuration in the memo, the wake-ups, one daemon loop,
one status write.

A run's daemon (:mod:`.run.handlers`) and a sweep's (:mod:`.sweep.handlers`) are the same loop: a pass,
an error recorded and backed off, a sleep until woken (:func:`daemon`); and write their status the same way,
as a merge patch of the top-level keys that changed (:func:`status_patch`, :func:`write_status`), fenced by the
resourceVersion it was planned from (:func:`write_fenced`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import kopf

from mlbench_operator import metrics as m
from mlbench_operator.kube import ApiError, Kube
from mlbench_operator.podview import PodIndex, PodView, RunKey
from mlbench_operator.settings import OperatorConfig

#: What handlers given no configured memo use (unit tests calling them directly); under kopf,
#: :func:`configure` has always put a config in the memo before any resource handler runs.
DEFAULT_CONFIG = OperatorConfig()


def pods_of(memo: object, key: RunKey) -> list[PodView]:
    """A run's pods from the operator's :class:`PodIndex` (``memo.pods``, filled by :class:`PodWatch`)."""
    index = getattr(memo, "pods", None)
    return index.get(key) if isinstance(index, PodIndex) else []


def config_of(memo: object) -> OperatorConfig:
    """The operator's configuration, typed, from kopf's memo (``memo.config``; every resource's memo is
    a shallow copy of the operator's, so it is there too)."""
    config = getattr(memo, "config", None)
    return config if isinstance(config, OperatorConfig) else DEFAULT_CONFIG


class Wakeups:
    """One asyncio.Event per run key; pod and run events set it, the run's daemon waits on it."""

    def __init__(self) -> None:
        # A list: a run deleted and re-created under the same name briefly has two daemons.
        self._events: dict[tuple[str, str], list[asyncio.Event]] = {}

    def register(self, key: tuple[str, str]) -> asyncio.Event:
        event = asyncio.Event()
        self._events.setdefault(key, []).append(event)
        return event

    def unregister(self, key: tuple[str, str], event: asyncio.Event) -> None:
        events = self._events.get(key, [])
        if event in events:
            events.remove(event)
        if not events:
            self._events.pop(key, None)

    def wake(self, key: tuple[str, str]) -> None:
        for event in self._events.get(key, []):
            event.set()

    def wake_namespace(self, namespace: str) -> None:
        """A fetch Job changed: any run of the namespace may be waiting for it (they are few)."""
        for key in [k for k in self._events if k[0] == namespace]:
            self.wake(key)

    @staticmethod
    async def sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, delay: float | None, debounce: float) -> bool:
        """A daemon's pause between passes: until ``wake`` is set, the daemon is stopped, or ``delay`` passes
        (None: no time limit); then ``debounce`` more, so a burst of events (1000 pods starting) makes one
        pass. True: stop now."""
        woken = asyncio.ensure_future(wake.wait())
        stopping = asyncio.ensure_future(stopped.wait())
        timeout = None if delay is None else max(delay, 0.05)
        try:
            await asyncio.wait({woken, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            stopping.cancel()
        if stopped:
            return True
        await asyncio.sleep(debounce)
        return False


async def daemon(
    wakeups: Wakeups,
    key: tuple[str, str],
    stopped: kopf.DaemonStopped,
    *,
    kind: str,
    step: Callable[[], Awaitable[float | None]],
    recover: Callable[[], None],
    log: Any,
    debounce: float,
    done_when_idle: bool,
) -> None:
    """A resource's loop: ``step`` (seconds until the next unprompted pass, or None: nothing left to do), then
    a sleep until woken, the daemon stopped, or the delay passed. Any error is counted (``kind``), logged,
    backed off (its own ``delay``, else doubling up to a minute) and followed by ``recover`` (trust the
    cluster's status again). A pass that returns None ends the loop when ``done_when_idle``; otherwise the
    daemon waits to be woken."""
    wake = wakeups.register(key)
    failures = 0
    try:
        while True:
            wake.clear()
            try:
                delay = await step()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as err:  # any error: record, back off, retry from the cluster's state
                failures += 1
                m.RECONCILE_ERRORS.labels(kind, type(err).__name__).inc()
                log.warning("reconcile_error", kind=kind, error=str(err), failures=failures)
                delay = getattr(err, "delay", None) or min(2.0**failures, 60.0)
                recover()
            if (delay is None and done_when_idle) or stopped or await Wakeups.sleep(wake, stopped, delay, debounce):
                return
    finally:
        wakeups.unregister(key, wake)


class StatusConflict(kopf.TemporaryError):
    """A status write was refused with 409: the object changed since the version the pass planned from (another
    replica wrote it: this one may have been deposed). It was read again; the next pass plans from that."""

    def __init__(self, message: str) -> None:
        super().__init__(message, delay=0.1)


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level status keys that changed (a JSON merge patch for the status subresource)."""
    return {k: v for k, v in new.items() if old.get(k) != v}


async def write_status(
    kube: Kube, write: Callable[..., Any], namespace: str, name: str, changes: dict[str, Any], *fence: str
) -> Any:
    """Send a status merge patch (``write``: the resource's status writer of :class:`Kube`, given ``fence``:
    the resourceVersion to write at) unless it is empty; what ``write`` returns (None when nothing was sent)."""
    if changes:
        return await kube.run(write, namespace, name, changes, *fence)
    return None


def _set(status: Mapping[str, Any]) -> dict[str, Any]:
    """A status without the keys a merge patch deleted (our copy keeps them as None; the cluster's lacks them)."""
    return {k: v for k, v in status.items() if v is not None}


def fence_version(known: str, body: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """The resourceVersion a status write is made at (the fence: the API server refuses it with 409 when the
    object changed since). ``known``: the version our last write returned (or the one the daemon started
    from); ``body``: the object as the watch last delivered it; ``ours``: the status the pass planned from.

    The watch's version is newer and safe when its status is the one we planned from (only metadata or spec
    moved: a label, kopf's annotations); otherwise the watch lags behind our own write, or someone else wrote
    the status (a new leader): then ``known``, and a 409 if it is stale."""
    seen = str((body.get("metadata") or {}).get("resourceVersion") or "")
    if seen and _set(body.get("status") or {}) == _set(ours):
        return seen
    return known or seen


class Fenced(Protocol):
    """What :func:`write_fenced` reads and keeps: a daemon of one object (a run's, a sweep's)."""

    #: The resourceVersion the status was last written or read at (the fence of the next write).
    version: str
    #: The object's status as read after a refused (409) write: what the daemon's ``recover`` trusts.
    reread: Mapping[str, Any] | None

    @property
    def kube(self) -> Kube: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def body(self) -> Mapping[str, Any]: ...  # the object as the watch last delivered it
    @property
    def status(self) -> Mapping[str, Any]: ...  # the status the pass planned from
    @property
    def log(self) -> Any: ...


async def write_fenced(
    owner: Fenced, write: Callable[..., Any], read: Callable[[str, str], Any], changes: dict[str, Any]
) -> None:
    """One status write of ``owner``'s object at :func:`fence_version` (``write``: its status writer of
    :class:`Kube`). The version written at is kept; a 409 (the object changed since: a deposed leader's late
    write) reads the object again (``read(namespace, name)``), keeps its version and status (``reread``) and
    raises :class:`StatusConflict`: the next pass plans from what was read. When what was read has the status
    the pass planned from (only metadata or spec moved, e.g. kopf's finalizer patch the watch had not delivered
    yet: :func:`fence_version`'s rule), the write is made once more at the version read instead."""
    version = fence_version(owner.version, owner.body, owner.status)
    written: Any = None
    for refence in (True, False):
        try:
            written = await write_status(owner.kube, write, owner.namespace, owner.name, changes, version)
            break
        except ApiError as err:
            if err.status != 409:
                raise
            live = await owner.kube.run(read, owner.namespace, owner.name) or {}
            current = str((live.get("metadata") or {}).get("resourceVersion") or "")
            if refence and current and _set(live.get("status") or {}) == _set(owner.status):
                owner.log.info("status_refenced", version=version, current=current)
                version = current
                continue
            owner.version = current
            owner.reread = dict(live.get("status") or {})
            owner.log.info("status_conflict", version=version, current=current, keys=sorted(changes))
            message = f"the status write at resourceVersion {version} was refused (409): read again"
            raise StatusConflict(message) from err
    if written:
        owner.version = str(written)
