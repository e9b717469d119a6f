"""client-go's LeaderElector: the acquire loop (jittered retries), the renew loop (until the renew deadline)
and the release, glue around the pure :func:`.leasedecision.decide` and a :class:`.leaseapi.LeaseClient`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from mlbench_operator import logs
from mlbench_operator import metrics as m
from mlbench_operator.leadersettings import JITTER_FACTOR, LeaderSettings
from mlbench_operator.leaseapi import LeaseClient, LeaseNamespaceMissing
from mlbench_operator.leasedecision import (
    Action,
    Decision,
    LeaseRecord,
    Observed,
    decide,
    expiry,
    micro_time,
    observe,
    release_spec,
)

T = TypeVar("T")


STANDBY_REPORT_SECONDS = 60.0


log = logs.get_logger("mlbench_operator.leader")


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
