"""``metav1.Condition`` bookkeeping: lastTransitionTime moves only when the status flips."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from mlbench_api.datasets import FetchReason

Condition = dict[str, Any]

# Condition types, in the order ``kubectl describe`` shows them.
DATASET_READY = "DatasetReady"  #: only on runs whose task has a dataset.source
WORKERS_READY = "WorkersReady"
RUNNING = "Running"
GOAL_REACHED = "GoalReached"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
RESTARTED = "Restarted"  #: True after a gang restart, with the cause
# kstatus (sigs.k8s.io/cli-utils) conditions, which Flux, Argo CD and ``kubectl wait`` read generically.
READY = "Ready"  #: True once the run Succeeded; False with the phase (or the failure) as the reason
RECONCILING = "Reconciling"  #: True while the run is Pending, Starting or Running
STALLED = "Stalled"  #: True when the run Failed, or Running with a step counter that stopped moving
TYPES = (DATASET_READY, WORKERS_READY, RUNNING, GOAL_REACHED, SUCCEEDED, FAILED, RESTARTED, READY, RECONCILING, STALLED)
#: Stalled's reason while Running when the step counter has not moved for progressDeadlineSeconds.
NO_PROGRESS = "NoProgress"


class DatasetReason(StrEnum):
    """Reasons of ``DatasetReady`` (and of ``Failed`` when a fetch fails)."""

    FETCHING = "Fetching"  #: False: the fetch Job is being created, runs, or retries
    FETCHED = "Fetched"  #: True: the verified data is in the dataset volume
    SOURCE_UNREACHABLE = FetchReason.SOURCE_UNREACHABLE.value
    CHECKSUM_MISMATCH = FetchReason.CHECKSUM_MISMATCH.value
    VOLUME_FULL = FetchReason.VOLUME_FULL.value
    FETCH_FAILED = FetchReason.FETCH_FAILED.value


#: WorkersReady's reason while the dataset is fetched (no worker exists yet).
WAITING_FOR_DATASET = "WaitingForDataset"


#: C0/C1 control characters except tab and newline: terminal escapes from a pod's output must not
#: reach ``kubectl describe`` (a tenant's log line could rewrite another user's terminal).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """Text copied from pods (termination messages, logs) made safe for status, conditions and Events."""
    return _CONTROL.sub("", text)


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes it."""
    return now.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


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
    """Return a new list with ``type_`` set; keeps the old lastTransitionTime if status is unchanged."""
    old = get(conditions, type_)
    new: Condition = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": clean(message)[:32768],
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
    order = {t: i for i, t in enumerate(TYPES)}
    return sorted(out, key=lambda c: order.get(c.get("type", ""), len(order)))
