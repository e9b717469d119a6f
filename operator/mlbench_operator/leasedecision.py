"""The leader election's pure decision, clock-injected (client-go's ``tryAcquireOrRenew`` minus the I/O).

:func:`observe` (when did *this* process last see the Lease record change), :func:`decide` (acquire, renew or
stand by, and the Lease spec to write) and :func:`release_spec`.

A Lease is judged by the local clock from the moment a change of its record was *observed*, never
by the holder's ``renewTime``: the pods' clocks may disagree, and a record that does not change for
``leaseDurationSeconds`` has expired whatever its timestamps say. A fresh process therefore waits
one full lease duration before taking over a Lease someone else held (as client-go does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from mlbench_operator.leadersettings import LeaderSettings

Spec = dict[str, Any]


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
