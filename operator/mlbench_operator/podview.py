"""A small, hashable summary of a pod: what the reconciler needs, nothing more.

The operator keeps one of these per pod in a :class:`PodIndex` by run (memory stays small at 1000
workers) and decides from them; the raw pod dicts are never stored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mlbench_operator import naming as n
from mlbench_operator.conditions import Reason


class PodPhase(StrEnum):
    """A pod's ``status.phase`` as the kubelet reports it (not the run's :class:`mlbench_api.runstatus.Phase`)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


#: Pod phases a pod never leaves (its containers will not run again: restartPolicy Never).
POD_FINISHED = (PodPhase.SUCCEEDED, PodPhase.FAILED)


def controller_uid(obj: Mapping[str, Any] | None) -> str | None:
    """UID of the object's controller owner (``ownerReferences[].controller``); None when it has none."""
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller")), None)


#: Container waiting reasons that will not fix themselves; shown to the user as the cause.
STUCK_WAITING = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}
)


#: How ``mlbench-runner worker`` starts its termination message when a rank was OOM-killed inside it
#: (the container itself survives such a kill, so the runtime may not say OOMKilled).
OOM_PREFIX = "OOMKilled:"


def _memory_limit(pod: Mapping[str, Any]) -> str | None:
    """The first container's memory limit (the worker's or the launcher's), as the pod spec says it."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    limit = ((containers[0].get("resources") or {}).get("limits") or {}).get("memory")
    return str(limit) if limit is not None else None


def disruption(condition: Mapping[str, Any] | None) -> str | None:
    """``"reason: message"`` of a pod's DisruptionTarget condition when it is True (the pod is being removed by a
    drain, an eviction, the taint manager or a preemption, not failing of itself), else None."""
    if not condition or condition.get("status") != "True":
        return None
    return f"{condition.get('reason') or 'DisruptionTarget'}: {condition.get('message') or 'no message'}"


@dataclass(frozen=True)
class PodView:
    name: str
    role: str
    rank: int | None
    attempt: int
    phase: str = PodPhase.PENDING
    ready: bool = False
    scheduled: bool = False
    unschedulable: str | None = None  #: the scheduler's message while PodScheduled=False/Unschedulable
    terminating: bool = False
    reason: str | None = None  #: pod-level reason (e.g. Evicted, DeadlineExceeded)
    message: str | None = None  #: pod-level message
    exit_code: int | None = None
    term_reason: str | None = None  #: container terminated reason (Completed, Error, OOMKilled)
    term_message: str | None = None  #: container termination message (the launcher's result)
    waiting: str | None = None  #: "reason: message" of a container stuck waiting
    ip: str | None = None
    owner_uid: str | None = None  #: UID of the controller owner (the run that created the pod)
    deletion_timestamp: str | None = None  #: when the kubelet should have removed a terminating pod
    finished_at: str | None = None  #: when the container that decided exit_code terminated
    uid: str | None = None  #: the pod's own UID (deletes are conditional on it: names repeat across attempts)
    image_id: str | None = None  #: the digest the main container runs (the kubelet's imageID): what a tag meant
    #: "reason: message" of the pod's DisruptionTarget condition (a drain's eviction, the taint manager, preemption)
    disrupted: str | None = None
    memory_limit: str | None = None  #: the main container's memory limit (named when the kernel killed it)
    created: str | None = None  #: metadata.creationTimestamp (RFC 3339, set by the API server)
    node: str | None = None  #: spec.nodeName: the node the pod was bound to

    @property
    def finished(self) -> bool:
        return self.phase in POD_FINISHED

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodView | None:
        """Summarise a pod dict; None if it does not carry the operator's labels."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        role = labels.get(n.LABEL_ROLE)
        if role not in (n.ROLE_WORKER, n.ROLE_LAUNCHER) or n.LABEL_RUN not in labels:
            return None
        try:
            attempt = int(labels.get(n.LABEL_ATTEMPT, "0"))
            rank = int(labels[n.LABEL_RANK]) if role == n.ROLE_WORKER else None
        except (KeyError, ValueError):
            return None
        status = pod.get("status") or {}
        conds = {c.get("type"): c for c in status.get("conditions") or []}
        sched = conds.get("PodScheduled") or {}
        unschedulable = None
        if sched.get("status") == "False" and sched.get("reason") == "Unschedulable":
            unschedulable = sched.get("message") or "unschedulable"
        exit_code = term_reason = term_message = waiting = finished_at = None
        main = status.get("containerStatuses") or []
        # An init container matters only when it failed (then the main container never ran) or is
        # stuck waiting (e.g. ImagePullBackOff: the main container then only says PodInitializing).
        init = [
            cs
            for cs in status.get("initContainerStatuses") or []
            if ((cs.get("state") or {}).get("terminated") or {}).get("exitCode", 0) != 0
            or ((cs.get("state") or {}).get("waiting") or {}).get("reason") in STUCK_WAITING
        ]
        for cs in [*main, *init]:
            state = cs.get("state") or {}
            term = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if term and (exit_code is None or (exit_code == 0 and term.get("exitCode", 0) != 0)):
                exit_code = term.get("exitCode")
                term_reason = term.get("reason")
                term_message = term.get("message")
                finished_at = term.get("finishedAt")
            wait = state.get("waiting")
            if wait and wait.get("reason") in STUCK_WAITING and waiting is None:
                waiting = f"{wait.get('reason')}: {wait.get('message', '')}".rstrip(": ")
        return cls(
            name=meta.get("name", ""),
            role=role,
            rank=rank,
            attempt=attempt,
            phase=status.get("phase") or PodPhase.PENDING,
            ready=(conds.get("Ready") or {}).get("status") == "True",
            scheduled=sched.get("status") == "True" or bool((pod.get("spec") or {}).get("nodeName")),
            unschedulable=unschedulable,
            terminating=meta.get("deletionTimestamp") is not None,
            reason=status.get("reason"),
            message=status.get("message"),
            exit_code=exit_code,
            term_reason=term_reason,
            term_message=term_message,
            waiting=waiting,
            ip=status.get("podIP"),
            owner_uid=controller_uid(pod),
            deletion_timestamp=meta.get("deletionTimestamp"),
            finished_at=finished_at,
            uid=meta.get("uid"),
            image_id=next((cs.get("imageID") for cs in main if cs.get("imageID")), None),
            disrupted=disruption(conds.get("DisruptionTarget")),
            memory_limit=_memory_limit(pod),
            created=meta.get("creationTimestamp"),
            node=(pod.get("spec") or {}).get("nodeName"),
        )

    def failure(self) -> tuple[Reason, str]:
        """``(reason, message)`` naming the real cause of this pod's failure."""
        what = "launcher" if self.role == n.ROLE_LAUNCHER else f"worker {self.rank}"
        # the kubelet's words (pod and container reasons) on the left, the run's Reason on the right
        if self.reason == "Evicted":
            return Reason.EVICTED, f"{what} (pod {self.name}) was evicted: {self.message or 'no message'}"
        if self.term_reason == "OOMKilled" or (self.term_message or "").startswith(OOM_PREFIX):
            # the worker's own words (mlbench-runner worker) say which limit a rank outgrew
            detail = (self.term_message or "").removeprefix(OOM_PREFIX).strip()
            limit = f", memory limit {self.memory_limit}" if self.memory_limit else ""
            text = f"{what} (pod {self.name}) was OOMKilled (exit code {self.exit_code}{limit})"
            return Reason.OOM_KILLED, f"{text}: {_tail(detail, 1024)}" if detail else text
        if self.reason == "DeadlineExceeded":
            return Reason.DEADLINE_EXCEEDED, f"{what} (pod {self.name}) exceeded its active deadline"
        base = Reason.LAUNCHER_FAILED if self.role == n.ROLE_LAUNCHER else Reason.WORKER_FAILED
        if self.role == n.ROLE_LAUNCHER and self.exit_code == INPUT_ERROR_EXIT_CODE:
            base = Reason.INVALID_INPUT
        detail = f"exit code {self.exit_code}" if self.exit_code is not None else f"phase {self.phase}"
        if self.term_reason and self.term_reason not in ("Error", "Completed"):
            detail += f" ({self.term_reason})"
        text = explain_signals(_error_text(self.term_message or self.message or ""))
        if text:
            detail += f": {_tail(text, 1024)}"
        return base, f"{what} (pod {self.name}) failed with {detail}"


#: ``mlbench-runner`` (launch and every rank) exits 2 when it refuses its input (a config, a hostfile);
#: mpirun passes a rank's code on. A restart would fail the same way, so the run fails at once.
INPUT_ERROR_EXIT_CODE = 2

#: Open MPI's words for a rank the kernel killed; in a container that is nearly always the OOM killer
#: (a rank outgrowing the limit inside a worker whose sshd survives, or the launcher itself).
_SIGKILL = re.compile(r"(exited on|killed by) signal 9\b( \(Killed\))?")


def explain_signals(text: str) -> str:
    """ "exited on signal 9 (Killed)" reads as what it nearly always means to a benchmark user."""
    return _SIGKILL.sub("was killed (signal 9, likely out of memory)", text)


def _error_text(text: str) -> str:
    """The launcher writes ``{"error": ..., "exitCode": n}``; show the error, else the raw text (logs)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            return text
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            return data["error"]
    return text


def _tail(text: str, limit: int) -> str:
    """The end of a long text (logs put the real error last)."""
    return text if len(text) <= limit else "..." + text[-limit:]


#: A run's identity: (namespace, name).
RunKey = tuple[str, str]


@dataclass(frozen=True)
class PodChange:
    """One pod event, summarised where it was decoded: the pod's UID and, unless it is gone or is not a
    run's pod (no run label, no role), its run and view."""

    uid: str
    key: RunKey | None = None
    view: PodView | None = None

    @classmethod
    def of(cls, kind: str, pod: Mapping[str, Any]) -> PodChange | None:
        """From a watch event's type and object (or a listed pod, as ADDED); None without a UID."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return None
        run = (meta.get("labels") or {}).get(n.LABEL_RUN)
        view = PodView.from_pod(pod) if kind != "DELETED" and run else None
        if view is None or not run:
            return cls(uid)
        return cls(uid, (str(meta.get("namespace") or ""), str(run)), view)


class PodIndex:
    """The operator's pods as :class:`PodView` by run, kept from watch events (:class:`PodChange`).

    Not thread-safe: the watch threads hand their changes to the event loop, which applies them.
    """

    def __init__(self) -> None:
        self._runs: dict[RunKey, dict[str, PodView]] = {}  #: run -> pod UID -> view
        self._keys: dict[str, RunKey] = {}  #: pod UID -> its run

    def get(self, key: RunKey, default: Iterable[PodView] = ()) -> list[PodView]:
        """The run's pods (``default`` when it has none)."""
        pods = self._runs.get(key)
        return list(pods.values()) if pods else list(default)

    def __len__(self) -> int:
        return len(self._keys)

    def update(self, change: PodChange) -> set[RunKey]:
        """Apply one change; returns the runs whose pods it changed (a pod relabelled to another run: both)."""
        touched: set[RunKey] = set()
        old = self._keys.pop(change.uid, None)
        if old is not None:
            pods = self._runs[old]
            del pods[change.uid]
            if not pods:
                del self._runs[old]
            touched.add(old)
        if change.key is not None and change.view is not None:
            self._runs.setdefault(change.key, {})[change.uid] = change.view
            self._keys[change.uid] = change.key
            touched.add(change.key)
        return touched

    def reset(self, changes: Iterable[PodChange], namespace: str | None = None) -> set[RunKey]:
        """A listing of every pod (of ``namespace``; None: of all): afterwards the index holds exactly these
        (in that namespace); returns the runs whose pods differ from before (missed deletions included)."""
        before = {k: v for k, v in self._runs.items() if namespace is None or k[0] == namespace}
        for key in before:
            del self._runs[key]
        self._keys = {uid: key for uid, key in self._keys.items() if key not in before}
        for change in changes:
            if change.key is not None and (namespace is None or change.key[0] == namespace):
                self.update(change)
        after = {k for k in self._runs if namespace is None or k[0] == namespace}
        return {k for k in before.keys() | after if before.get(k) != self._runs.get(k)}
