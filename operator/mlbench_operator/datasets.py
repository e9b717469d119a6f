"""Where a run's sourced dataset stands, as a pure function of its fetch Job and the Job's pods.

The fetch Job is shared by every run in the namespace that needs the same data, so its outcome
is read, never owned: :func:`fetch_state` maps (job, pods, when the run was admitted) to what
the run should do next. The termination message of the Job's pod carries the classified failure
(``mlbench_api.datasets``); a Job that failed *before* this run was admitted is history, not this
run's failure: it is replaced, so one bad fetch never wedges a namespace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from mlbench_api.datasets import FetchFailure, redact_urls
from mlbench_operator import conditions as c
from mlbench_operator.conditions import DatasetReason


class FetchAction(StrEnum):
    CREATE = "create"  #: no Job: create it
    WAIT = "wait"  #: the Job runs (or retries, or is being deleted)
    REPLACE = "replace"  #: a Job that failed before this run was admitted: delete it, then create anew
    READY = "ready"  #: the data is there
    FAIL = "fail"  #: the fetch failed for this run: the run fails with ``reason``


@dataclass(frozen=True)
class FetchState:
    action: FetchAction
    reason: DatasetReason
    message: str


def _condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    conds = (job.get("status") or {}).get("conditions") or []
    return next((x for x in conds if x.get("type") == type_ and x.get("status") == "True"), None)


def _pod_time(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            return dict(term)
    return None


def last_failure(pods: Sequence[Mapping[str, Any]]) -> FetchFailure | None:
    """The newest failed pod's classified failure (the fetcher's JSON termination message); None when that pod
    left none (killed: OOM, the Job's deadline), not an older attempt's, which would be taken for its cause."""
    for pod in sorted(pods, key=_pod_time, reverse=True):
        if (pod.get("status") or {}).get("phase") == "Failed":
            return FetchFailure.parse((_terminated(pod) or {}).get("message"))
    return None


def _unclassified(pods: Sequence[Mapping[str, Any]]) -> str:
    """What a failed pod said when it is not our JSON (e.g. the image has no fetch-dataset: the log tail)."""
    for pod in sorted(pods, key=_pod_time, reverse=True):
        status = pod.get("status") or {}
        term = _terminated(pod) or {}
        if status.get("phase") == "Failed":
            text = redact_urls(term.get("message") or status.get("message") or "").strip()
            code = term.get("exitCode")
            detail = f"pod {(pod.get('metadata') or {}).get('name')} exited with code {code}"
            return f"{detail}: {text[-1024:]}" if text else detail
    return ""


def _pending_detail(pods: Sequence[Mapping[str, Any]]) -> str:
    """Why the newest pod does not run yet: unschedulable (e.g. an unbound PVC) or a stuck container."""
    newest = max(pods, key=_pod_time, default=None)
    if newest is None:  # e.g. the Job controller's pod create was refused (quota, PodSecurity)
        return "; no pod yet (kubectl describe job shows why)"
    status = newest.get("status") or {}
    name = (newest.get("metadata") or {}).get("name")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"; pod {name} cannot be scheduled: {cond.get('message') or cond.get('reason')}"
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") not in (None, "ContainerCreating"):
            return f"; pod {name}: {waiting.get('reason')}: {waiting.get('message', '')}".rstrip(": ")
    return ""


def fetch_state(
    job_name: str,
    job: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    admitted_at: datetime | None,
    volume: str,
) -> FetchState:
    """The next step for a run waiting for its dataset; ``pods`` are the Job's pods (any order). ``job`` is the
    operator's own (:func:`mlbench_operator.run.ownership.shared_not_ours` passed it; else :func:`name_conflict`)."""
    fetching = DatasetReason.FETCHING
    if job is None:
        return FetchState(FetchAction.CREATE, fetching, f"creating the fetch Job {job_name}")
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return FetchState(FetchAction.WAIT, fetching, f"waiting for the old fetch Job {job_name} to be deleted")
    if _condition(job, "Complete") is not None:
        return FetchState(FetchAction.READY, DatasetReason.FETCHED, f"fetched into volume {volume} by Job {job_name}")
    failed = _condition(job, "Failed")
    if failed is not None:
        return _failed_job(job_name, failed, pods, admitted_at)
    status = job.get("status") or {}
    attempts = int(status.get("failed") or 0)
    message = f"fetch Job {job_name} is running"
    if attempts:
        previous = last_failure(pods)
        message += f" (retry {attempts}"
        message += f"; last attempt: {previous.reason.value}: {previous.message})" if previous else ")"
    return FetchState(FetchAction.WAIT, fetching, message + _pending_detail(pods))


def _failed_job(
    job_name: str, failed: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], admitted_at: datetime | None
) -> FetchState:
    """A Job whose ``Failed`` condition is True: this run's failure, or history to replace when it
    failed before the run was admitted."""
    failed_at = c.parse_time(failed.get("lastTransitionTime"))
    failure = last_failure(pods)
    if admitted_at is not None and failed_at is not None and failed_at < admitted_at:
        why = f"{failure.reason.value}: {failure.message}" if failure else failed.get("reason", "failed")
        return FetchState(
            FetchAction.REPLACE,
            DatasetReason.FETCHING,
            f"the fetch Job {job_name} failed before this run started ({why}); replacing it",
        )
    reason = failed.get("reason") or "Failed"
    if reason == "DeadlineExceeded":  # stopped from outside: the last attempt's own words are not the cause
        last = f"; last attempt: {failure.reason.value}: {failure.message}" if failure else ""
        text = f"fetch Job {job_name} failed (DeadlineExceeded: its activeDeadlineSeconds passed){last}"
        return FetchState(FetchAction.FAIL, DatasetReason.FETCH_FAILED, text)
    if failure is not None:
        return FetchState(FetchAction.FAIL, DatasetReason(failure.reason.value), failure.message)
    detail = _unclassified(pods) or failed.get("message") or ""
    text = f"fetch Job {job_name} failed ({reason})" + (f": {detail}" if detail else "")
    return FetchState(FetchAction.FAIL, DatasetReason.FETCH_FAILED, text)


def name_conflict(text: str) -> FetchState:
    """The dataset volume's or the fetch Job's name is held by an object the operator did not create: the run waits
    (``NameConflict``, ``text`` naming the object and why), never using it nor replacing it."""
    return FetchState(FetchAction.WAIT, DatasetReason.NAME_CONFLICT, text)


def refused(code: int, detail: str, volume: str, job_name: str) -> FetchState:
    """The API server refused the PVC or the Job: 422 (invalid) fails the run, 403 (quota, policy) waits."""
    text = f"creating the dataset volume {volume} or the fetch Job {job_name} was refused (HTTP {code}): {detail}"
    if code == 422:
        return FetchState(FetchAction.FAIL, DatasetReason.FETCH_FAILED, text)
    return FetchState(FetchAction.WAIT, DatasetReason.FETCHING, text)
