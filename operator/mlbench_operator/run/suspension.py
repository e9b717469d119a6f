"""``spec.suspend`` and ``spec.managedBy`` (Kubernetes Job semantics), and the gate a queue puts on a run (pure).

A run whose Kueue Workload is deactivated (:func:`deactivated_plan`) is not held: it fails, as the Workload is
never admitted again.

A run is held (:func:`gate`) while ``spec.suspend`` is true or, with the label ``kueue.x-k8s.io/queue-name``,
until Kueue admits its Workload (:mod:`.kueue`). A held run has no pods: :func:`held_plan` deletes those it
has and says why (phase ``Suspended``, condition ``Suspended`` True). A run that had pods of its current
attempt moves to the next attempt, counted as a disruption restart (not against ``runPolicy.maxRestarts``,
as for a preemption), so that it resumes from a fresh world. When the gate opens, :func:`resumed_status`
starts the run again with a new ``startTime`` (the active deadline counts from the resume, as a Job's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mlbench_api.run import MANAGED_BY_OPERATOR
from mlbench_api.runstatus import Phase
from mlbench_operator import conditions as c
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodView
from mlbench_operator.run import ownership
from mlbench_operator.run.kueue import PODS_READY_TIMEOUT, Admission
from mlbench_operator.run.lifecycle import _deletable, _own
from mlbench_operator.run.startup import started
from mlbench_operator.run.status import Plan, StoredStatus, _Status


def managed_here(spec: Mapping[str, Any]) -> bool:
    """Whether this operator reconciles the run: ``spec.managedBy`` unset or :data:`MANAGED_BY_OPERATOR`."""
    return spec.get("managedBy") in (None, MANAGED_BY_OPERATOR)


@dataclass(frozen=True)
class Gate:
    """Why a run may not have pods now: the Suspended condition's reason and message."""

    reason: Reason
    message: str


def gate(spec: Mapping[str, Any], queued: Admission | None) -> Gate | None:
    """The run's gate: ``spec.suspend`` first, then its Kueue admission (None: not queued through Kueue)."""
    if spec.get("suspend"):
        return Gate(Reason.SUSPENDED, "spec.suspend is true: the run has no pods until it is set to false")
    if queued is not None and not queued.admitted:
        timed_out = queued.evicted == PODS_READY_TIMEOUT
        return Gate(Reason.PODS_READY_TIMEOUT if timed_out else Reason.QUEUED, queued.message)
    return None


def _not_ready(st: _Status, held: Gate) -> str:
    """WorkersReady's message while held: for a PodsReadyTimeout, why the workers were not Ready (what the
    condition said before the eviction, kept while the reason stays), else that a held run has no pods."""
    gone = f"no pods while suspended ({held.reason})"
    if held.reason != Reason.PODS_READY_TIMEOUT:
        return gone
    before = c.find(st.old.conditions, c.WORKERS_READY)
    if before is None:
        return gone
    if before.reason == Reason.PODS_READY_TIMEOUT:
        return before.message or gone
    if before.status == "False" and before.message:
        return f"pods released by Kueue; they were not Ready: {before.message}"
    return f"pods released by Kueue; {gone}"


def held_plan(body: Mapping[str, Any], uid: str, pods: Iterable[PodView], held: Gate, now: datetime) -> Plan:
    """The status of a held run, and its own pods to delete (each by UID)."""
    st = _Status.of(body, now)
    own, _foreign = _own(pods, uid)
    restarts = st.old.restarts or 0
    if any(p.attempt == restarts for p in own):  # it had started: resume from a fresh world
        st.new.restarts = restarts + 1
        st.new.disruption_restarts = (st.old.disruption_restarts or 0) + 1
        st.new.launcher = None
    st.new.phase = Phase.SUSPENDED
    st.cond(c.SUSPENDED, "True", held.reason, held.message)
    gone = f"no pods while suspended ({held.reason})"
    st.cond(c.WORKERS_READY, "False", held.reason, _not_ready(st, held))
    st.cond(c.RUNNING, "False", held.reason, gone)
    st.in_progress()
    left = [p for p in own if not p.terminating]
    st.say(held.message if not left else f"{held.message}; deleting {len(left)} pods")
    events = [("Normal", str(held.reason), held.message)] if st.changed(c.SUSPENDED, message=True) else []
    return Plan(status=st.dump(), delete_stale=_deletable(own), events=events)


def deactivated_plan(
    body: Mapping[str, Any], uid: str, pods: Iterable[PodView], queued: Admission, now: datetime
) -> Plan | None:
    """A run whose Kueue Workload was deactivated (``spec.active`` false: waitForPodsReady's requeuing
    ``backoffLimitCount`` spent, or an admin) ends ``Failed``/``WorkloadDeactivated`` with Kueue's message (None:
    not deactivated): the Workload is never admitted again, and a run held for it would wait forever. Its
    unfinished pods are deleted whatever cleanPodPolicy says (they hold resources Kueue no longer counts); the
    Workload is then marked Finished as for any finished run."""
    if not queued.deactivated:
        return None
    st = _Status.of(body, now)
    message = f"Kueue deactivated the run's Workload, which is never admitted again ({queued.message})"
    st.fail(Reason.WORKLOAD_DEACTIVATED, message)
    own, _foreign = _own(pods, uid)
    release = _deletable([p for p in own if not p.finished])
    return Plan(status=st.dump(), delete_stale=release, events=[("Warning", str(Reason.WORKLOAD_DEACTIVATED), message)])


def pods_gone(pods: Iterable[PodView], uid: str) -> bool:
    """Whether the run has no pod left, not even a terminating one (an evicted Workload's quota may go back)."""
    return not _own(pods, uid)[0]


def attempt_started(pods: Iterable[PodView], uid: str, status: Mapping[str, Any]) -> bool:
    """Whether the run's current attempt (``status.restarts``) has started: its launcher left Pending
    (:mod:`.startup`). Only the launcher the operator accepts as the attempt's counts
    (:func:`.ownership.accepted_launcher`): a pod of that name put there by anyone else, with whatever marks,
    never makes the operator tell Kueue that the run's pods are ready."""
    launcher = ownership.accepted_launcher(pods, uid, StoredStatus.parse(status, report=False).model)
    return started(launcher) and launcher is not None and not launcher.terminating


def resumed_status(body: Mapping[str, Any], queued: Admission | None, now: datetime) -> dict[str, Any] | None:
    """The status that starts a held run again (None: it was not held): phase Pending, a new startTime,
    Suspended False (Resumed, or Admitted with Kueue's word)."""
    st = _Status.of(body, now)
    if st.old.phase != Phase.SUSPENDED:
        return None
    st.new.phase = Phase.PENDING
    st.new.start_time = c.instant(now)
    reason, text = (
        (Reason.ADMITTED, queued.message) if queued is not None else (Reason.RESUMED, "spec.suspend is false")
    )
    st.cond(c.SUSPENDED, "False", reason, text)
    st.cond(c.WORKERS_READY, "False", Reason.CREATING, "the run resumes: creating its workers")
    st.cond(c.RUNNING, "False", Reason.WAITING_FOR_WORKERS, "the launcher starts once every worker is Ready")
    st.say(text)
    return st.dump()
