"""Whose is an object that holds a name the operator uses for a run: the pure decision behind ``NameConflict``.

The operator creates a run's pods, Service, ConfigMaps, Secret and NetworkPolicy under names derived from the
run's (``<run>-worker-<i>``, ``<run>-launcher``, ``<run>-ssh``, ``<run>-results``...). A create answered 409
means something holds the name: the operator's own object from an interrupted pass, a deleted run's object
the garbage collector has not reached yet, or one a namespace user put there. Only the first is used; every
other is reported as ``NameConflict`` (a condition and an Event naming the object and why it is not the
run's), never adopted, never retried in silence.

What marks the operator's object for *this* run: its controller ownerReference is the BenchmarkRun of the
run's UID, and it carries the operator's ``managed-by`` label and the run's ``mlbench.io/run`` label (every
object the operator creates for a run has all three: :mod:`mlbench_operator.runcontext`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mlbench_api.runstatus import TERMINAL, BenchmarkRunStatus, LauncherRecord
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.fetchjob import URL_FLAG
from mlbench_operator.podview import PodView


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None)


def not_ours(obj: Mapping[str, Any], run: str, uid: str) -> str | None:
    """Why ``obj`` is not an object the operator created for run ``run`` (UID ``uid``); None when it is."""
    ref = _controller(obj)
    if ref is None:
        return "it has no controller"
    if ref.get("kind") != "BenchmarkRun" or ref.get("uid") != uid:
        return f"its controller is {ref.get('kind', '?')} {ref.get('name', '?')} (uid {ref.get('uid') or 'none'})"
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get(n.LABEL_MANAGED_BY) != n.MANAGER:
        return f"its label {n.LABEL_MANAGED_BY} is not {n.MANAGER}"
    if labels.get(n.LABEL_RUN) != run:
        return f"its label {n.LABEL_RUN} is not {run}"
    return None


def objects_may_exist(status: Mapping[str, Any]) -> bool:
    """Whether a run's objects (ConfigMap, Secret, NetworkPolicy, PodGroup) may exist already, from its status as
    a new daemon finds it: they are created only after admission, which writes ``taskSnapshot``. True after an
    operator restart (or a daemon spawned again): they are read first, not generated and created again."""
    return bool(status.get("taskSnapshot"))


def to_create(
    wanted: Iterable[tuple[str, str]], existing: Mapping[tuple[str, str], Mapping[str, Any] | None], run: str, uid: str
) -> tuple[list[tuple[str, str]], tuple[str, str, str] | None]:
    """Of the run's ``wanted`` objects ``(kind, name)``, those to create (not in ``existing``, or read as missing),
    and the first held by another owner ``(kind, name, why)`` (:func:`not_ours`; nothing is created then). One
    that exists and is the run's is reused as it is: the ConfigMap and the Secret are immutable, and the run's
    world (its hostfile, its keys) never changes."""
    missing: list[tuple[str, str]] = []
    for key in wanted:
        obj = existing.get(key)
        if obj is None:
            missing.append(key)
            continue
        why = not_ours(obj, run, uid)
        if why is not None:
            return [], (*key, why)
    return missing, None


def _without_url(command: Any) -> Any:
    """A fetch command without its source URL's value (:data:`URL_FLAG`): a mirror's Job is the same fetch."""
    if not isinstance(command, list) or URL_FLAG not in command:
        return command
    at = command.index(URL_FLAG)
    return command[:at] + command[at + 2 :]


def _template(obj: Mapping[str, Any]) -> tuple[list[tuple[Any, ...]], Any]:
    """A Job's pod template as the trust check compares it: what every container and init container runs (image,
    command without the source URL, args, env: fields the API server does not default), and the volumes (all
    immutable once the Job exists); empty for an object without a pod template (a PVC)."""
    spec = (((obj.get("spec") or {}).get("template") or {}).get("spec")) or {}
    runs = [
        (kind, x.get("image"), _without_url(x.get("command")), x.get("args"), x.get("env"))
        for kind in ("initContainers", "containers")
        for x in spec.get(kind) or []
    ]
    return runs, spec.get("volumes")


def shared_not_ours(obj: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    """Why ``obj`` is not the shared object the operator creates as ``wanted`` (the namespace's dataset volume, a
    fetch Job: owned by no run); None when it is. Such an object has no controller and carries every label and
    annotation the operator gives it (for a fetch Job: the dataset, its key, the source's SHA-256 and the store
    entry); a fetch Job's pod template also runs the operator's image and command and mounts only its volumes: a
    Job made by anyone else, or for other data, is never trusted, whatever its name and ``Complete`` say."""
    ref = _controller(obj)
    if ref is not None:
        return f"its controller is {ref.get('kind', '?')} {ref.get('name', '?')}"
    meta, want = obj.get("metadata") or {}, wanted.get("metadata") or {}
    for part in ("labels", "annotations"):
        have = meta.get(part) or {}
        for key, value in sorted((want.get(part) or {}).items()):
            if have.get(key) != value:
                return f"its {part[:-1]} {key} is {have[key]!r}, not {value!r}" if key in have else f"it has no {key}"
    (containers, volumes), (want_containers, want_volumes) = _template(obj), _template(wanted)
    if containers != want_containers:
        return "its pod template runs another image or command than the operator's"
    if volumes != want_volumes:
        return "its pod template mounts other volumes than the operator's"
    return None


def conflict_text(kind: str, name: str, why: str, doing: str = "waiting for it to be deleted") -> str:
    """The ``NameConflict`` message: the object, why it is not the run's, and what the operator does."""
    return f"{kind} {name} already exists and was not created by the operator for this run ({why}); {doing}"


def launcher_refused(pod: PodView, status: BenchmarkRunStatus, attempt: int) -> str | None:
    """Why the launcher-named ``pod`` of attempt ``attempt`` is not the run's launcher; None when it is.

    The operator records the UID its create of the attempt's launcher was answered with
    (``status.launcher``): only that pod is accepted. Without a record for the attempt (a run admitted by an
    older operator, or one that stopped between the create and the record) the pod is accepted only if it
    was created once the attempt's workers were all Ready (WorkersReady True), as the operator creates it:
    a launcher put there earlier, with whatever ownerReference and labels, is not the run's; nor, once the run
    failed with ``NameConflict`` (one answered the operator's create with 409: :func:`held_launcher`), any.
    """
    record = status.launcher
    if record is not None and record.attempt == attempt:
        if pod.uid == record.uid:
            return None
        return f"it is not the launcher the operator created (uid {pod.uid or 'none'}, recorded {record.uid})"
    failed = c.find(status.conditions, c.FAILED)
    if failed is not None and failed.status == "True" and failed.reason == c.Reason.NAME_CONFLICT:
        return "the run failed because a pod the operator did not create held the launcher's name"
    return _unrecorded_refused(pod, status)


def _unrecorded_refused(pod: PodView, status: BenchmarkRunStatus) -> str | None:
    """:func:`launcher_refused` without a record for the attempt: judged by when the pod was created."""
    if status.phase in TERMINAL and status.launcher is not None:  # this operator records every launcher it accepts
        return "the operator recorded no launcher for the attempt"
    ready = c.find(status.conditions, c.WORKERS_READY)
    created = c.parse_time(pod.created)
    if ready is None or created is None:
        return None  # nothing to judge by (a run before its first status; a pod without a creation time)
    if status.completion_time is not None and created > status.completion_time:
        return "it was created after the run ended"
    if ready.status != "True" and status.phase not in TERMINAL:
        return "it was created before the attempt's workers were all Ready"
    if ready.status == "True" and created < ready.last_transition_time.replace(microsecond=0):
        return "it was created before the attempt's workers were all Ready"
    return None


#: How far outside the operator's own measure of an unanswered launcher create a pod's ``creationTimestamp`` may
#: lie and still be its: the timestamp has whole seconds (truncated), from the API server's clock.
UNANSWERED_MARGIN = timedelta(seconds=1)
#: Unanswered launcher creates a daemon remembers for the attempt (one a pass at most, paced by the backoff).
UNANSWERED_KEPT = 8


@dataclass(frozen=True)
class UnansweredCreate:
    """The operator's create of attempt ``attempt``'s launcher that failed without saying whether it was applied
    (:func:`mlbench_operator.kube.may_have_applied`): sent at ``sent``, given up at ``given_up`` (the operator's
    wall clock; the span measured on the monotonic one)."""

    attempt: int
    sent: datetime
    given_up: datetime


def remember_unanswered(kept: Iterable[UnansweredCreate], new: UnansweredCreate) -> tuple[UnansweredCreate, ...]:
    """The unanswered creates to remember after ``new``: those of its attempt, the last :data:`UNANSWERED_KEPT`."""
    return (*(u for u in kept if u.attempt == new.attempt), new)[-UNANSWERED_KEPT:]


def sent_unanswered(existing: Mapping[str, Any], unanswered: Iterable[UnansweredCreate], attempt: int) -> bool:
    """Whether the launcher-named pod ``existing`` may be the one an unanswered create of attempt ``attempt``
    made: it was created (``creationTimestamp``) while that create was under way, give or take
    :data:`UNANSWERED_MARGIN`. A pod made by anyone else during that span passes too: that is the price of
    not failing the run on the operator's own pod."""
    created = c.parse_time((existing.get("metadata") or {}).get("creationTimestamp"))
    if created is None:
        return False
    return any(
        u.attempt == attempt and u.sent - UNANSWERED_MARGIN <= created <= u.given_up + UNANSWERED_MARGIN
        for u in unanswered
    )


def recorded(status: BenchmarkRunStatus, attempt: int, uid: str) -> bool:
    """Whether ``status.launcher`` names the pod of UID ``uid`` as attempt ``attempt``'s launcher."""
    record = status.launcher
    return record is not None and record.attempt == attempt and record.uid == uid


def held_launcher(
    existing: Mapping[str, Any], status: BenchmarkRunStatus, attempt: int, unanswered: Iterable[UnansweredCreate] = ()
) -> str | None:
    """Why the pod that answered the operator's create of attempt ``attempt``'s launcher with 409 is not the run's
    launcher; None when it is the one the operator recorded creating (``status.launcher``: an earlier pass's
    create, e.g. before a restart, that the pod watch had not shown yet), or one created while an earlier create
    of the attempt by this daemon went unanswered (:func:`sent_unanswered`: its UID was never known, so never
    recorded; the caller records it).

    Otherwise the pod is never the run's, whatever its ownerReference, labels and creation time: the
    operator records every launcher it creates, and one put under the name between WorkersReady and the
    operator's create would otherwise pass :func:`launcher_refused` as created after the workers were Ready."""
    record = status.launcher
    uid = (existing.get("metadata") or {}).get("uid") or "none"
    if recorded(status, attempt, uid) or (uid != "none" and sent_unanswered(existing, unanswered, attempt)):
        return None
    which = f"recorded {record.uid}" if record is not None and record.attempt == attempt else "none recorded"
    return f"the operator's create of the launcher was answered 409 by a pod it did not create (uid {uid}, {which})"


def accepted_launcher(pods: Iterable[PodView], uid: str, status: BenchmarkRunStatus) -> PodView | None:
    """The current attempt's launcher whose exit and log are the run's (:func:`launcher_refused` passes it), of
    the run's UID (none given: any); None when there is none."""
    attempt = status.restarts or 0
    for pod in pods:
        if pod.role != n.ROLE_LAUNCHER or pod.attempt != attempt or (uid and pod.owner_uid != uid):
            continue
        if launcher_refused(pod, status, attempt) is None:
            return pod
    return None


def launcher_record(record: LauncherRecord | None, launcher: PodView | None) -> LauncherRecord | None:
    """``status.launcher`` for the attempt's accepted ``launcher`` (:func:`launcher_refused` passed it): with the
    digest its container ran (the kubelet's imageID) once reported. One accepted without a record for its attempt
    (the operator stopped between its create and the record) is recorded now, so that once the run has ended only
    a recorded launcher is the run's. ``record`` as it is for no launcher, or a pod without a UID."""
    if launcher is None or not launcher.uid:
        return record
    image = launcher.image_id[:512] if launcher.image_id else None
    if record is None or record.attempt != launcher.attempt:
        return LauncherRecord(uid=launcher.uid, attempt=launcher.attempt, image_id=image)
    if record.uid != launcher.uid or image is None or record.image_id == image:
        return record
    return record.model_copy(update={"image_id": image})


def results_differ(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    """Why the ``<run>-results`` ConfigMap found under the name (its marks this run's) does not hold the files
    the operator would keep there now; None when it does (its own, from an interrupted pass: the files are
    compressed deterministically). A namespace editor can forge the marks, not the launcher's files."""
    have = existing.get("binaryData") or {}
    want = wanted.get("binaryData") or {}
    if existing.get("data"):
        return "it holds text data the operator never writes there"
    if set(have) != set(want):
        return f"it holds files {sorted(have)}, the launcher printed {sorted(want)}"
    changed = sorted(k for k in want if have[k] != want[k])
    return f"its {changed[0]} is not the launcher's" if changed else None
