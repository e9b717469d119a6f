"""The run's status vocabulary (condition types and reasons) and ``metav1.Condition`` bookkeeping.

Every reason the operator writes is a member of :class:`Reason` (or :class:`DatasetReason`), so the
set is stated once, documented next to its use, and checked against docs/operator.md by a test.
``lastTransitionTime`` moves only when a condition's status flips.

Two forms of the same bookkeeping: :func:`put`, :func:`find` and :func:`holds` on typed conditions
(``mlbench_api.common.Condition``), which the BenchmarkRun's status is built from, and
:func:`set_condition`, :func:`get` and :func:`is_true` on the wire's dicts (a BenchmarkSweep's status,
and readers of a stored status).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

from mlbench_api.common import Condition as ConditionModel
from mlbench_api.contract import (
    DATASET_READY,
    FAILED,
    GOAL_REACHED,
    READY,
    RECONCILING,
    RESTARTED,
    RUNNING,
    STALLED,
    SUCCEEDED,
    SUSPENDED,
    TYPES,
    WORKERS_READY,
    DatasetReason,
    Reason,
)

#: A condition as the wire carries it (``metav1.Condition`` in JSON); :class:`ConditionModel` is the typed one.
#: The condition types and reasons are the pod contract's (:mod:`mlbench_api.contract`); handed on here.
__all__ = [
    "DATASET_READY",
    "FAILED",
    "GOAL_REACHED",
    "READY",
    "RECONCILING",
    "RESTARTED",
    "RUNNING",
    "STALLED",
    "SUCCEEDED",
    "SUSPENDED",
    "TYPES",
    "WORKERS_READY",
    "DatasetReason",
    "Reason",
]

Condition = dict[str, Any]
#: ``Condition.status``.
ConditionStatus = Literal["True", "False", "Unknown"]
#: ``Condition.message`` and ``status.message``: the CRD's maxLength.
MAX_MESSAGE = 32768

_ORDER = {t: i for i, t in enumerate(TYPES)}


def order(type_: str) -> int:
    """Sort key of a condition type: :data:`TYPES` first, in that order, then any other type."""
    return _ORDER.get(type_, len(_ORDER))


#: The name tests/operator/test_datasets.py reads WorkersReady's dataset-wait reason by.
WAITING_FOR_DATASET = Reason.WAITING_FOR_DATASET


#: C0/C1 control characters except tab and newline: terminal escapes from a pod's output must not
#: reach ``kubectl describe`` (a tenant's log line could rewrite another user's terminal).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """Text copied from pods (termination messages, logs) made safe for status, conditions and Events."""
    return _CONTROL.sub("", text)


def stored_text(text: str) -> str:
    """A condition's or the status' message as stored: cleaned, at most :data:`MAX_MESSAGE` characters."""
    return clean(text)[:MAX_MESSAGE]


def instant(now: datetime) -> datetime:
    """``now`` as Kubernetes stores a time: in UTC, to the second (a naive ``now`` is local time)."""
    return now.astimezone(UTC).replace(microsecond=0)


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes it."""
    return instant(now).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# -- typed conditions (the BenchmarkRun's status) -----------------------------------------------------------------
def find(conditions: Iterable[ConditionModel] | None, type_: str) -> ConditionModel | None:
    return next((c for c in conditions or () if c.type == type_), None)


def holds(conditions: Iterable[ConditionModel] | None, type_: str) -> bool:
    """Whether the condition ``type_`` is there with status True."""
    cond = find(conditions, type_)
    return cond is not None and cond.status == "True"


def put(
    conditions: Iterable[ConditionModel],
    type_: str,
    status: ConditionStatus,
    reason: str,
    text: str,
    *,
    now: datetime,
    generation: int | None = None,
) -> list[ConditionModel]:
    """A new list with ``type_`` set (sorted by :func:`order`); the old lastTransitionTime is kept while
    the status stays the same. ``reason`` is a :class:`Reason`, :class:`DatasetReason` or phase member
    (stored as its plain string), or a reason echoed from the stored status."""
    conditions = list(conditions)
    old = find(conditions, type_)
    fields: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": str(reason),
        "message": stored_text(text),
        "last_transition_time": old.last_transition_time if old is not None and old.status == status else instant(now),
    }
    if generation is not None:  # no observedGeneration key at all without one, as before
        fields["observed_generation"] = generation
    new = ConditionModel(**fields)
    out = [new if c.type == type_ else c for c in conditions]
    if old is None:
        out.append(new)
    return sorted(out, key=lambda c: order(c.type))


# -- the wire's dicts (a BenchmarkSweep's status; readers of a stored status) -------------------------------------
def get(conditions: list[Condition] | None, type_: str) -> Condition | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[Condition] | None, type_: str) -> bool:
    cond = get(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    now: datetime,
    generation: int | None = None,
) -> list[Condition]:
    """Return a new list with ``type_`` set; keeps the old lastTransitionTime if status is unchanged
    (:func:`put` on dicts)."""
    old = get(conditions, type_)
    new: Condition = {
        "type": type_,
        "status": status,
        "reason": str(reason),  # a plain string in the stored status, also for a Reason or Phase member
        "message": clean(message)[:MAX_MESSAGE],
        "lastTransitionTime": (
            old["lastTransitionTime"]
            if old is not None and old.get("status") == status and old.get("lastTransitionTime")
            else timestamp(now)
        ),
    }
    if generation is not None:
        new["observedGeneration"] = generation
    out = [c if c.get("type") != type_ else new for c in conditions]
    if old is None:
        out.append(new)
    return sorted(out, key=lambda c: order(c.get("type", "")))
