"""Leader election on a ``coordination.k8s.io/v1`` Lease: of N replicas, exactly one reconciles.

The semantics are client-go's (``k8s.io/client-go/tools/leaderelection``), in two layers:

* pure, clock-injected: :class:`LeaderSettings` (from the environment, validated like
  :mod:`.settings`), :func:`observe` (when did *this* process last see the Lease record change) and
  :func:`decide` (acquire, renew or stand by, and the Lease spec to write), :func:`release_spec`.
* thin glue: :class:`LeaseApi` (GET/POST/PUT of the one Lease; writes carry the resourceVersion
  read, so of two replicas writing at once one gets 409 Conflict and stays standby),
  :class:`Elector` (the acquire and renew loops) and :func:`run_elected` (wait for the Lease, then
  run kopf beside the renew loop; stop kopf and exit non-zero when renewals fail for the renew
  deadline; release the Lease on a clean stop so that the standby takes over at once).

A Lease is judged by the local clock from the moment a change of its record was *observed*, never
by the holder's ``renewTime``: the pods' clocks may disagree, and a record that does not change for
``leaseDurationSeconds`` has expired whatever its timestamps say. A fresh process therefore waits
one full lease duration before taking over a Lease someone else held (as client-go does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlsplit

from aiohttp import web
from kubernetes import client as k8s

from mlbench_api.common import DNS1123_LABEL, DNS1123_SUBDOMAIN
from mlbench_operator import logs
from mlbench_operator import metrics as m
from mlbench_operator.env import SettingsError
from mlbench_operator.kube import USER_AGENT, ApiError, load_configuration

T = TypeVar("T")
Spec = dict[str, Any]

#: client-go's wait.JitterUntil factor for the acquire loop: sleep retry * (1 + U[0, 1.2)).
JITTER_FACTOR = 1.2
DEFAULT_NAME = "mlbench-operator"
DEFAULT_NAMESPACE = "mlbench-system"
#: A standby repeats whom it waits for at most this often (and at once when the holder changes).
STANDBY_REPORT_SECONDS = 60.0
_DNS1123_LABEL = re.compile(DNS1123_LABEL)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

log = logs.get_logger("mlbench_operator.leader")


# -- settings -----------------------------------------------------------------------------------------
def default_identity() -> str:
    """``POD_NAME`` in a pod (stable across container restarts), else ``<hostname>_<pid>``."""
    return f"{socket.gethostname()}_{os.getpid()}"


@dataclass(frozen=True)
class LeaderSettings:
    """Who competes for which Lease, and client-go's three durations (defaults: 15 s, 10 s, 2 s)."""

    enabled: bool = True
    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    identity: str = "operator"
    #: How long a Lease whose record stopped changing still counts as held (written to the Lease).
    lease_duration: int = 15
    #: The leader gives up (stops reconciling, exits non-zero) after failing to renew this long.
    renew_deadline: float = 10.0
    #: Between two tries (acquire: jittered by up to 1.2x more; renew: not).
    retry_period: float = 2.0

    @classmethod
    def from_env(cls, env: Mapping[str, str], enabled: bool | None = None) -> LeaderSettings:
        """``MLBENCH_LEADER_*``, ``POD_NAME``, ``POD_NAMESPACE``; raises :class:`SettingsError` naming the variable.

        ``enabled`` (the ``--[no-]leader-elect`` flag) wins over ``MLBENCH_LEADER_ELECT``.
        """
        d = cls()
        if enabled is None:
            raw = env.get("MLBENCH_LEADER_ELECT", "").strip().lower()
            if raw and raw not in _TRUE + _FALSE:
                raise SettingsError(f"MLBENCH_LEADER_ELECT={raw!r} is not one of true, false")
            enabled = raw not in _FALSE
        name = env.get("MLBENCH_LEADER_ELECTION_ID", "").strip() or d.name
        if not _DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
            raise SettingsError(f"MLBENCH_LEADER_ELECTION_ID={name!r} is not a valid Lease name")
        key = "MLBENCH_LEADER_ELECTION_NAMESPACE"
        namespace = env.get(key, "").strip()
        if not namespace:
            key, namespace = "POD_NAMESPACE", env.get("POD_NAMESPACE", "").strip() or d.namespace
        if not _DNS1123_LABEL.match(namespace) or len(namespace) > 63:
            raise SettingsError(f"{key}={namespace!r} is not a valid namespace name")
        identity = env.get("POD_NAME", "").strip() or default_identity()
        lease = _seconds(env, "MLBENCH_LEADER_ELECTION_LEASE_DURATION_SECONDS", d.lease_duration, whole=True)
        renew = _seconds(env, "MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS", d.renew_deadline)
        retry = _seconds(env, "MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS", d.retry_period)
        # client-go's NewLeaderElector checks, with the variables named
        if lease <= renew:
            raise SettingsError(
                f"MLBENCH_LEADER_ELECTION_LEASE_DURATION_SECONDS={lease:g} must be greater than "
                f"MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS={renew:g}"
            )
        if renew <= JITTER_FACTOR * retry:
            raise SettingsError(
                f"MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS={renew:g} must be greater than "
                f"{JITTER_FACTOR} x MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS={retry:g}"
            )
        return cls(
            enabled=enabled,
            name=name,
            namespace=namespace,
            identity=identity,
            lease_duration=int(lease),
            renew_deadline=renew,
            retry_period=retry,
        )


def _seconds(env: Mapping[str, str], key: str, default: float, whole: bool = False) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number of seconds" if whole else "a number of seconds"
        raise SettingsError(f"{key}={raw!r} is not {kind}") from None
    if not 0 < value < float("inf"):  # NaN fails both
        raise SettingsError(f"{key}={raw!r} must be greater than 0")
    return value


# -- the pure decision --------------------------------------------------------------------------------
def micro_time(t: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says (client-go's LeaderElectionRecord) and the resourceVersion it was read at."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str = ""

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )

    def same_record(self, other: LeaseRecord) -> bool:
        """The record unchanged (client-go compares the raw record; the resourceVersion is not part of it)."""
        return replace(self, resource_version="") == replace(other, resource_version="")


@dataclass(frozen=True)
class Observed:
    """A Lease record and when this process first saw it as it is (by the local clock)."""

    record: LeaseRecord
    since: datetime


def observe(previous: Observed | None, record: LeaseRecord, now: datetime) -> Observed:
    """The new observation: ``since`` moves only when the record changed (a renewal by the holder)."""
    if previous is not None and previous.record.same_record(record):
        return Observed(record, previous.since)
    return Observed(record, now)


def expiry(observed: Observed, settings: LeaderSettings) -> datetime:
    """When the observed holder's claim runs out unless its record changes again."""
    seconds = observed.record.lease_duration_seconds or settings.lease_duration
    return observed.since + timedelta(seconds=seconds)


class Action(StrEnum):
    ACQUIRE = "acquire"
    RENEW = "renew"
    STANDBY = "standby"


@dataclass(frozen=True)
class Decision:
    action: Action
    #: Why, for the logs: no-lease, held-by-me, held-by-other, released, expired.
    reason: str
    #: The holder before this decision ("" when none).
    holder: str
    #: The Lease spec to write (None: write nothing).
    spec: Spec | None = None
    #: POST a new Lease (none exists) instead of a PUT at ``resource_version``.
    create: bool = False
    resource_version: str = ""


def _spec(identity: str, settings: LeaderSettings, acquired: str, renewed: str, transitions: int) -> Spec:
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": settings.lease_duration,
        "acquireTime": acquired,
        "renewTime": renewed,
        "leaseTransitions": transitions,
    }


def decide(observed: Observed | None, identity: str, now: datetime, settings: LeaderSettings) -> Decision:
    """client-go's tryAcquireOrRenew, minus the I/O: ``observed`` is None when no Lease exists."""
    stamp = micro_time(now)
    if observed is None:
        return Decision(Action.ACQUIRE, "no-lease", "", _spec(identity, settings, stamp, stamp, 0), create=True)
    rec = observed.record
    if rec.holder == identity:  # keep acquireTime and the transition count
        spec = _spec(identity, settings, rec.acquire_time or stamp, stamp, rec.transitions)
        return Decision(Action.RENEW, "held-by-me", identity, spec, resource_version=rec.resource_version)
    if rec.holder and now < expiry(observed, settings):
        return Decision(Action.STANDBY, "held-by-other", rec.holder)
    spec = _spec(identity, settings, stamp, stamp, rec.transitions + 1)
    reason = "expired" if rec.holder else "released"
    return Decision(Action.ACQUIRE, reason, rec.holder, spec, resource_version=rec.resource_version)


def release_spec(observed: Observed | None, identity: str, now: datetime) -> Spec | None:
    """client-go's release: no holder, a 1 s duration; None when the Lease is not ours to release."""
    if observed is None or observed.record.holder != identity:
        return None
    stamp = micro_time(now)
    return {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": observed.record.transitions,
    }


# -- the API ------------------------------------------------------------------------------------------
class LeaseClient(Protocol):
    """One Lease's GET/POST/PUT, blocking (what :class:`Elector` needs; a fake in the unit tests)."""

    def get(self) -> dict[str, Any] | None: ...
    def create(self, spec: Spec) -> dict[str, Any] | None: ...
    def update(self, spec: Spec, resource_version: str) -> dict[str, Any] | None: ...
    def close(self) -> None: ...


class LeaseNamespaceMissing(SettingsError):
    """The Lease's namespace does not exist (a create answered 404): no replica can ever lead there. Not a
    lost race (409): standing by would reconcile nothing, for ever, in silence."""

    def __init__(self, namespace: str) -> None:
        super().__init__(
            f"the leader-election Lease's namespace {namespace!r} does not exist: create it "
            "(manifests/operator/namespace.yaml), set MLBENCH_LEADER_ELECTION_NAMESPACE to a namespace where the "
            "operator may create Leases, or run one replica with --no-leader-elect"
        )
        self.namespace = namespace


class LeaseApi:
    """The Lease over the kubernetes client's transport (configured like :mod:`.kube`).

    Its own client and a request timeout of half the renew deadline (at least 1 s), as
    controller-runtime does: a hung request must not eat the whole renew deadline. Not counted in
    ``mlbench_operator_api_requests_total`` (the reconciler's requests).
    """

    def __init__(self, namespace: str, name: str, timeout: float, configuration: Any = None) -> None:
        self.api = k8s.ApiClient(configuration or load_configuration())
        self.api.user_agent = f"{USER_AGENT} leader-election"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
        self.namespace = namespace
        self.name = name
        self.timeout = max(1.0, timeout)

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        _, url, headers, data, post = self.api.param_serialize(
            method=method,
            resource_path=path,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(method, url, headers, data, post, _request_timeout=(self.timeout, self.timeout))
        except k8s.ApiException as exc:  # the client's own error for an HTTP status
            status, text = int(exc.status or 0), str(exc.body or exc.reason or "")
        else:
            raw = resp.read()
            status, text = resp.status, raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
        if status in (404, 409):
            return status, None
        if not 200 <= status < 300:
            raise ApiError(status, method, path, text)
        return status, json.loads(text) if text else None

    def _body(self, spec: Spec, resource_version: str = "") -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def get(self) -> dict[str, Any] | None:
        """The Lease; None when it does not exist."""
        _, lease = self._request("GET", f"{self.collection}/{quote(self.name)}")
        return lease

    def create(self, spec: Spec) -> dict[str, Any] | None:
        """The created Lease; None when another replica created it first (409). A 404 is not that: the
        namespace does not exist (:class:`LeaseNamespaceMissing`)."""
        status, lease = self._request("POST", self.collection, self._body(spec))
        if status == 404:
            raise LeaseNamespaceMissing(self.namespace)
        return lease

    def update(self, spec: Spec, resource_version: str) -> dict[str, Any] | None:
        """The written Lease; None on a conflict (someone wrote since we read) or when it is gone."""
        _, lease = self._request("PUT", f"{self.collection}/{quote(self.name)}", self._body(spec, resource_version))
        return lease

    def close(self) -> None:
        self.api.close()


# -- the loops ----------------------------------------------------------------------------------------
def monotonic_clock() -> Callable[[], datetime]:
    """Wall time at start plus monotonic time since: never jumps (NTP steps, suspend) while it runs."""
    start, start_wall = time.monotonic(), datetime.now(UTC)

    def now() -> datetime:
        return start_wall + timedelta(seconds=time.monotonic() - start)

    return now


@dataclass
class Elector:
    """client-go's LeaderElector: acquire (jittered retries), renew (until the renew deadline), release."""

    client: LeaseClient
    settings: LeaderSettings
    clock: Callable[[], datetime] = field(default_factory=monotonic_clock)
    jitter: Callable[[], float] = random.random
    observed: Observed | None = None
    leading: bool = False
    #: Set when leadership was lost (renew deadline passed, or another holder seen): never act again.
    lost: bool = False
    _pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="lease")
    )
    #: time.monotonic() when this replica took the Lease (None while standing by).
    leading_since: float | None = None
    #: The holder last reported (logged) while standing by, and when.
    _reported: tuple[str, datetime] | None = None

    @property
    def seen_holder(self) -> str | None:
        return self._reported[0] if self._reported is not None else None

    @property
    def identity(self) -> str:
        return self.settings.identity

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking client call on the elector's own threads (a busy reconciler pool cannot starve it)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def try_acquire_or_renew(self) -> Decision:
        """One round: read the Lease, decide, write. The decision's action says what happened
        (a lost write race comes back as STANDBY)."""
        lease = await self._call(self.client.get)
        now = self.clock()
        if lease is None:
            self.observed = None
        else:
            self.observed = observe(self.observed, LeaseRecord.from_lease(lease), now)
        decision = decide(self.observed, self.identity, now, self.settings)
        if decision.action is Action.STANDBY:
            self._note_holder(decision.holder)
            return decision
        assert decision.spec is not None
        if decision.create:
            written = await self._call(self.client.create, decision.spec)
        else:
            written = await self._call(self.client.update, decision.spec, decision.resource_version)
        if written is None:  # 409: another replica wrote first; its record is read next round
            log.info("leader_standby", reason="conflict", identity=self.identity, lease=self._lease_name())
            return replace(decision, action=Action.STANDBY, reason="conflict", spec=None)
        self.observed = Observed(LeaseRecord.from_lease(written), self.clock())
        return decision

    def _note_holder(self, holder: str) -> None:
        """Say whom this standby waits for: a log line when the holder changes, then at most every
        :data:`STANDBY_REPORT_SECONDS`; the :data:`~.metrics.LEADER_WAITING_FOR` gauge at every attempt."""
        now = self.clock()
        rec = self.observed.record if self.observed is not None else LeaseRecord()
        _waiting_for(holder, rec.renew_time)
        if not standby_report_due(self._reported, holder, now):
            return
        self._reported = (holder, now)
        until = expiry(self.observed, self.settings) if self.observed is not None else None
        log.info(
            "leader_standby",
            holder=holder,
            renew_time=rec.renew_time,
            identity=self.identity,
            lease=self._lease_name(),
            expires=micro_time(until) if until is not None else None,
        )

    def _lease_name(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"

    async def _sleep(self, seconds: float, stop: asyncio.Event) -> bool:
        """Sleep unless ``stop`` is set first; True when stopped. (No extra task: kopf cancels the
        tasks created while it runs when it stops.)"""
        try:
            async with asyncio.timeout(max(0.0, seconds)):
                await stop.wait()
        except TimeoutError:
            return False
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Try every retry period (jittered) until this replica leads (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            try:
                async with asyncio.timeout(self.settings.renew_deadline):
                    decision = await self.try_acquire_or_renew()
            except LeaseNamespaceMissing:
                raise  # no retry can pass: the operator stops, saying which namespace
            except Exception as err:
                log.warning("leader_acquire_failed", error=_describe(err), lease=self._lease_name())
            else:
                if decision.action is not Action.STANDBY:
                    self.leading = True
                    self.leading_since = time.monotonic()
                    m.LEADER.set(1)
                    m.LEADER_WAITING_FOR.clear()
                    log.info(
                        "leader_acquired",
                        identity=self.identity,
                        lease=self._lease_name(),
                        reason=decision.reason,
                        previous_holder=decision.holder or None,
                        transitions=(decision.spec or {}).get("leaseTransitions"),
                    )
                    return True
            delay = self.settings.retry_period * (1 + self.jitter() * JITTER_FACTOR)
            if await self._sleep(delay, stop):
                break
        return False

    async def renew(self, stop: asyncio.Event, on_lost: Callable[[], None]) -> None:
        """Renew every retry period until ``stop``; on failing for the renew deadline (or on seeing
        another holder: the Lease was taken) set ``lost``, call ``on_lost`` and set ``stop``."""
        deadline = self.clock() + timedelta(seconds=self.settings.renew_deadline)
        failing = False
        while not await self._sleep(self.settings.retry_period, stop):
            reason = ""
            try:
                remaining = (deadline - self.clock()).total_seconds()
                async with asyncio.timeout(max(0.1, remaining)):
                    decision = await self.try_acquire_or_renew()
            except Exception as err:
                reason = _describe(err)
            else:
                if decision.action is not Action.STANDBY:  # renewed (or re-created after a deletion)
                    if failing:
                        log.info("leader_renewed", identity=self.identity, lease=self._lease_name())
                    failing = False
                    deadline = self.clock() + timedelta(seconds=self.settings.renew_deadline)
                    continue
                if decision.reason == "held-by-other":
                    self._lose(f"the Lease is held by {decision.holder}", stop, on_lost)
                    return
                reason = decision.reason
            failing = True
            log.warning("leader_renew_failed", identity=self.identity, lease=self._lease_name(), error=reason)
            if self.clock() >= deadline:
                self._lose(f"no renewal for {self.settings.renew_deadline:g}s (last error: {reason})", stop, on_lost)
                return

    def _lose(self, why: str, stop: asyncio.Event, on_lost: Callable[[], None]) -> None:
        self.leading = False
        self.lost = True
        m.LEADER.set(0)
        log.error("leader_lost", identity=self.identity, lease=self._lease_name(), reason=why)
        on_lost()
        stop.set()

    async def release(self) -> bool:
        """Give the Lease up (holder cleared) so that a standby takes over at once; True when done."""
        if not self.leading:
            return False
        self.leading = False
        m.LEADER.set(0)
        try:
            lease = await self._call(self.client.get)
            if lease is not None:
                self.observed = observe(self.observed, LeaseRecord.from_lease(lease), self.clock())
            spec = release_spec(self.observed, self.identity, self.clock())
            if spec is None or self.observed is None:
                log.warning("leader_release_skipped", identity=self.identity, reason="not the holder any more")
                return False
            if await self._call(self.client.update, spec, self.observed.record.resource_version) is None:
                log.warning("leader_release_skipped", identity=self.identity, reason="conflict")
                return False
        except Exception as err:
            log.warning("leader_release_failed", identity=self.identity, error=_describe(err))
            return False
        log.info("leader_released", identity=self.identity, lease=self._lease_name())
        return True

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def standby_report_due(
    reported: tuple[str, datetime] | None, holder: str, now: datetime, every: float = STANDBY_REPORT_SECONDS
) -> bool:
    """Whether a standby logs whom it waits for now: at the first attempt, when the holder changed, and
    otherwise once every ``every`` seconds (an attempt every ~2 s would flood the log)."""
    if reported is None or reported[0] != holder:
        return True
    return (now - reported[1]).total_seconds() >= every


def _waiting_for(holder: str, renew_time: str | None) -> None:
    """The standby's gauge: one series, the holder's, valued with the Lease's renewTime."""
    m.LEADER_WAITING_FOR.clear()
    if holder:
        m.LEADER_WAITING_FOR.labels(holder).set(_epoch(renew_time))


def _epoch(stamp: str | None) -> float:
    """A MicroTime as Unix seconds; 0 when absent or unreadable (a holder's record is not ours to trust)."""
    if not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


# -- the standby's liveness endpoint ------------------------------------------------------------------
#: A replica that leads answers the probe itself until kopf serves it (after the first sync), for at most this long.
SYNC_DEADLINE_SECONDS = 300.0


def syncing_verdict(leading_since: float | None, now: float, limit: float = SYNC_DEADLINE_SECONDS) -> str | None:
    """None: alive (standing by, or leading and in the first sync for no longer than ``limit``); else why not."""
    if leading_since is None or now - leading_since <= limit:
        return None
    return f"leading for {now - leading_since:.0f}s and the first sync is not done (limit {limit:.0f}s)"


async def serve_liveness(endpoint: str, elector: Elector) -> Callable[[], Awaitable[None]]:
    """Answer the liveness probe while standing by and, once this replica leads, during kopf's first sync
    (kopf serves the probe only after its startup handlers, the pod listing among them: the gap would fail a
    slow start). Returns the coroutine function that stops serving (once; before kopf binds the same port)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http":
        raise SettingsError(f"--liveness={endpoint!r}: only http:// is supported")

    async def health(_: web.Request) -> web.Response:
        why = syncing_verdict(elector.leading_since, time.monotonic())
        body = {"leader": elector.leading, "holder": elector.seen_holder, "lease": elector._lease_name()}
        return web.json_response({**body, "error": why} if why else body, status=500 if why else 200)

    app = web.Application()
    app.add_routes([web.get(parts.path or "/", health)])
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, parts.hostname or "localhost", parts.port or 80).start()
    stopped = False

    async def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            await runner.cleanup()

    return stop


# -- the whole: wait, lead, stop ------------------------------------------------------------------------
def on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (the standby's way out, and kopf's stop flag while leading)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # RuntimeError: not the main thread
            loop.add_signal_handler(sig, stop.set)


class Watchdog:
    """client-go's leaders exit when they lose the Lease: should stopping kopf take longer than what
    is left of the other replicas' wait, end the process anyway (exit status 1)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        def hard_exit() -> None:
            log.error("leader_lost_exit", reason=f"the operator did not stop within {self.seconds:g}s")
            os._exit(1)

        self._timer = threading.Timer(self.seconds, hard_exit)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


async def run_elected(
    run_operator: Callable[[asyncio.Event], Awaitable[None]],
    settings: LeaderSettings,
    liveness: str | None = None,
    client: LeaseClient | None = None,
    stop: asyncio.Event | None = None,
    *,
    handover: Callable[[Callable[[], Awaitable[None]]], None] = lambda _stop: None,
) -> int:
    """Stand by until this replica holds the Lease, then ``run_operator(stop_flag)`` (kopf) while
    renewing it. Once leading, the standby's liveness endpoint keeps answering through kopf's first sync:
    ``handover`` gets the coroutine function that stops it (see :func:`serve_liveness`; called again, for
    sure, at the end). The exit status: 0 after a clean stop (SIGTERM; the Lease released), 1 when the
    Lease was lost (the Deployment restarts the pod, which stands by again)."""
    stop = stop or asyncio.Event()  # SIGTERM sets it while standing by; kopf's stop_flag while leading
    on_signals(stop)
    elector = Elector(client or LeaseApi(settings.namespace, settings.name, settings.renew_deadline / 2), settings)
    m.LEADER.set(0)
    log.info(
        "leader_election_started",
        identity=settings.identity,
        lease=f"{settings.namespace}/{settings.name}",
        lease_duration=settings.lease_duration,
        renew_deadline=settings.renew_deadline,
        retry_period=settings.retry_period,
    )
    stop_liveness: Callable[[], Awaitable[None]] | None = None
    try:
        stop_liveness = await serve_liveness(liveness, elector) if liveness else None
        acquired = await elector.acquire(stop)
        if not acquired:
            log.info("leader_election_stopped", identity=settings.identity, leading=False)
            return 0
        if stop_liveness is not None:
            handover(stop_liveness)  # the startup handler stops it when kopf is about to serve the probe
        grace = max(1.0, settings.lease_duration - settings.renew_deadline - settings.retry_period)
        watchdog = Watchdog(grace)
        renewer = asyncio.create_task(elector.renew(stop, watchdog.arm), name="leader-renew")
        try:
            await run_operator(stop)
        finally:
            watchdog.cancel()  # kopf has stopped
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            on_signals(stop)  # in case run_operator installed its own: a second SIGTERM must not cut the release
            if not elector.lost:
                await elector.release()
    finally:
        if stop_liveness is not None:
            await stop_liveness()
        elector.close()
    if elector.lost:
        return 1
    return 0
