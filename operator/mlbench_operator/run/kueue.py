"""Kueue: a run labelled ``kueue.x-k8s.io/queue-name`` is admitted as a whole, through a Workload the operator
manages (pure functions; the executor reads and writes the objects).

The operator plays the part Kueue's job integrations play for a Job or an MPIJob: one ``Workload`` per run
(owned by it, so it goes with the run), with a pod set for the workers (count = spec.workers) and one for the
launcher, each with the requests of the pods the operator will create. Until Kueue admits the Workload
(``Admitted`` True) the run is held as if suspended: no pods, condition ``Suspended`` True with reason
``Queued`` and Kueue's own message. Once admitted, the node labels and tolerations of the flavors Kueue
assigned each pod set go on that pod set's pods (the workers', the launcher's). Once the attempt has started
(the launcher runs) the Workload's ``PodsReady`` condition is set True, so that Kueue's ``waitForPodsReady``
leaves it alone. If Kueue evicts the Workload
(preemption, or ``waitForPodsReady``'s timeout: ``PodsReadyTimeout``) the run releases its pods, and once they
are gone the operator gives the quota back (:func:`release_patch`, as Kueue's job integrations do): Kueue
requeues the Workload. When the run ends the Workload is marked ``Finished``, which releases its quota.

Why not Kueue's plain-pod groups (``kueue.x-k8s.io/pod-group-name`` on every pod): they work only through
Kueue's pod webhook (it gates each pod with a scheduling gate), which needs a webhook server with
certificates reachable from the API server; the group's size is fixed on the pods, and a gang restart
replaces every pod, which Kueue sees as a new group to admit again. A Workload keeps the quota across the
run's gang restarts, like a Job's, and works with nothing but Kueue's controllers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mlbench_api.run import BenchmarkRunSpec
from mlbench_api.scheduling import Scheduling, Toleration
from mlbench_operator import conditions as c
from mlbench_operator.runcontext import RunContext

#: The label that names a run's LocalQueue (Kueue's, on any job kind).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP = "kueue.x-k8s.io"
#: Kueue v0.17 stores v1beta2 (v1beta1 is served without a conversion webhook, so only v1beta2 reads right).
API_VERSION = f"{GROUP}/v1beta2"
WORKLOADS = f"/apis/{API_VERSION}/namespaces/{{namespace}}/workloads"
FLAVOR = f"/apis/{API_VERSION}/resourceflavors/{{name}}"
WORKERS_POD_SET = "workers"
LAUNCHER_POD_SET = "launcher"
#: The field manager of the operator's server-side apply of a Workload's Finished condition.
FIELD_MANAGER = "mlbench-operator"
#: Workload conditions Kueue writes.
ADMITTED, QUOTA_RESERVED, EVICTED, FINISHED = "Admitted", "QuotaReserved", "Evicted", "Finished"
PODS_READY, REQUEUED = "PodsReady", "Requeued"
#: Kueue's eviction reason when an admitted Workload's ``PodsReady`` stayed unset past ``waitForPodsReady.timeout``.
PODS_READY_TIMEOUT = "PodsReadyTimeout"
#: The start of Kueue's eviction reason for a Workload whose ``spec.active`` is false (``Deactivated``, or
#: ``DeactivatedDueToRequeuingLimitExceeded`` once waitForPodsReady's ``backoffLimitCount`` is spent).
DEACTIVATED = "Deactivated"
#: The same eviction's reason in Kueue releases before the ``Deactivated...`` reasons.
INACTIVE_WORKLOAD = "InactiveWorkload"
#: Evictions after which Kueue's job integrations set ``Requeued`` True at once (others wait for a backoff).
_REQUEUED_AT_ONCE = ("Preempted", "NodeFailures")

_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "restartPolicy", "overhead")
_CONTAINER_FIELDS = ("name", "image", "resources")


def queue_name(body: Mapping[str, Any]) -> str | None:
    """The run's LocalQueue (its ``kueue.x-k8s.io/queue-name`` label), or None: not queued through Kueue."""
    value = ((body.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    return str(value) if value else None


def workload_name(run: str, uid: str) -> str:
    """The run's Workload: its name and the start of its UID (a deleted run's Workload may still be going)."""
    return f"{run}-{uid[:8]}"


def _template(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What Kueue reads of a pod (requests, where it may go), from the pod the operator will create."""
    spec = pod.get("spec") or {}
    out: dict[str, Any] = {k: spec[k] for k in _POD_FIELDS if k in spec}
    for key in ("initContainers", "containers"):
        if spec.get(key):
            out[key] = [{f: ct[f] for f in _CONTAINER_FIELDS if f in ct} for ct in spec[key]]
    return {"spec": out}


def workload(
    run: str,
    namespace: str,
    uid: str,
    *,
    queue: str,
    worker: Mapping[str, Any],
    launcher: Mapping[str, Any],
    count: int,
) -> dict[str, Any]:
    """The run's Workload: ``count`` workers like ``worker`` and one ``launcher``, in ``queue``, owned by the run."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(run, uid),
            "namespace": namespace,
            "labels": {QUEUE_LABEL: queue},
            "ownerReferences": [
                {
                    "apiVersion": "mlbench.io/v1alpha1",
                    "kind": "BenchmarkRun",
                    "name": run,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "queueName": queue,
            "podSets": [
                {"name": WORKERS_POD_SET, "count": count, "template": _template(worker)},
                {"name": LAUNCHER_POD_SET, "count": 1, "template": _template(launcher)},
            ],
        },
    }


@dataclass(frozen=True)
class Admission:
    """What a Workload says: admitted or not, why (Kueue's words), and the flavors it was assigned."""

    admitted: bool
    message: str
    flavors: tuple[str, ...] = ()
    #: (pod set, the flavors Kueue assigned it) of every pod set, from ``status.admission.podSetAssignments``
    assignments: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Kueue's reason while the Workload's ``Evicted`` condition is True (e.g. ``PodsReadyTimeout``), else ""
    evicted: str = ""
    #: the Workload still holds its quota (evicted: the operator must release it once the pods are gone)
    reserved: bool = False
    #: the Workload's ``PodsReady`` condition is True
    pods_ready: bool = False
    #: Kueue deactivated the Workload (``spec.active`` false, and evicted): it is never admitted again
    deactivated: bool = False


def _condition(workload: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return c.get((workload.get("status") or {}).get("conditions"), type_)


def _true(workload: Mapping[str, Any], type_: str) -> bool:
    cond = _condition(workload, type_)
    return cond is not None and cond.get("status") == "True"


def admission(workload: Mapping[str, Any] | None, name: str, queue: str) -> Admission:
    """Read a Workload (None: not created yet): admitted once ``Admitted`` is True and it is neither evicted nor
    finished; else the most telling of Kueue's messages (an eviction, a quota that cannot reserve, a missing
    queue)."""
    if workload is None:
        return Admission(False, f"creating Kueue Workload {name} in queue {queue}")
    status = workload.get("status") or {}
    evicted = _condition(workload, EVICTED) if _true(workload, EVICTED) else None
    reserved = bool(status.get("admission")) or _true(workload, QUOTA_RESERVED)
    ready = _true(workload, PODS_READY)
    if evicted is not None and (workload.get("spec") or {}).get("active") is False:
        text = f"queue {queue}, Workload {name}: {deactivation_message(evicted)}"
        return Admission(False, text, evicted=str(evicted.get("reason") or ""), reserved=reserved, deactivated=True)
    if _true(workload, ADMITTED) and evicted is None and _condition(workload, FINISHED) is None:
        assignments = (status.get("admission") or {}).get("podSetAssignments") or []
        by_set = tuple(
            (str(a.get("name", "")), tuple(sorted(set((a.get("flavors") or {}).values())))) for a in assignments
        )
        flavors = tuple(sorted({f for _, names in by_set for f in names}))
        message = f"admitted by Kueue (queue {queue}, Workload {name})"
        return Admission(True, message, flavors, by_set, reserved=reserved, pods_ready=ready)
    why = str((evicted or {}).get("reason") or "")
    for type_ in (EVICTED, QUOTA_RESERVED, ADMITTED):
        cond = _condition(workload, type_)
        if cond is not None and cond.get("message") and (type_ != EVICTED or evicted is not None):
            text = f"queue {queue}, Workload {name}: {cond['message']}"
            return Admission(False, text, evicted=why, reserved=reserved, pods_ready=ready)
    return Admission(False, f"queue {queue}, Workload {name}: waiting for Kueue", evicted=why, reserved=reserved)


def deactivation_message(evicted: Mapping[str, Any]) -> str:
    """Kueue's words for a deactivated Workload: its ``Evicted`` message (``Deactivated...``: "The workload is
    deactivated due to exceeding the maximum number of re-queuing retries"), or, when Kueue had evicted it for
    another reason before (it does not evict it again), that eviction's, said to be followed by deactivation."""
    message = str(evicted.get("message") or "")
    if str(evicted.get("reason") or "").startswith((DEACTIVATED, INACTIVE_WORKLOAD)):
        return message or "The workload is deactivated"
    return f"spec.active is false (deactivated) after Kueue evicted it: {message or evicted.get('reason')}"


def placement(flavors: Iterable[Mapping[str, Any]]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(node labels, tolerations) that the assigned ResourceFlavors put on the run's pods."""
    labels: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        labels.update(spec.get("nodeLabels") or {})
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    return labels, tolerations


def with_placement(
    spec: BenchmarkRunSpec, labels: Mapping[str, str], tolerations: list[dict[str, Any]]
) -> BenchmarkRunSpec:
    """The run's spec as its pods are built once admitted: the flavors' node labels and tolerations added to
    spec.scheduling (Kueue assigns only flavors that agree with the run's own nodeSelector)."""
    if not labels and not tolerations:
        return spec
    sched = spec.scheduling or Scheduling()
    given = list(sched.tolerations or [])
    extra = [Toleration.model_validate(t) for t in tolerations]
    merged = sched.model_copy(
        update={
            "node_selector": {**(sched.node_selector or {}), **labels},
            "tolerations": given + [t for t in extra if t not in given],
        }
    )
    return spec.model_copy(update={"scheduling": merged})


def placed(ctx: RunContext, assignments: Iterable[tuple[str, Iterable[str]]], flavors: Mapping[str, Any]) -> RunContext:
    """The run's context once admitted: each pod set's own flavors (``assignments``; ``flavors``: the
    ResourceFlavors by name) put their node labels and tolerations on its pods, the workers' on spec.scheduling
    (the workers and the dataset fetch), the launcher's on ``launcher_scheduling`` (when Kueue gave the launcher
    other flavors than the workers, neither pod set gets the other's labels: they could select no node at all)."""
    by_set = {pod_set: [flavors.get(f) or {} for f in names] for pod_set, names in assignments}
    workers = with_placement(ctx.spec, *placement(by_set.get(WORKERS_POD_SET, [])))
    launcher = with_placement(ctx.spec, *placement(by_set.get(LAUNCHER_POD_SET, [])))
    return dataclasses.replace(ctx, spec=workers, launcher_scheduling=launcher.scheduling or Scheduling())


def finished_patch(phase: str, now: datetime) -> dict[str, Any]:
    """A server-side apply of the Workload's ``Finished`` condition (``phase``: how the run ended): Kueue
    releases its quota."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "status": {
            "conditions": [
                {
                    "type": FINISHED,
                    "status": "True",
                    "reason": phase,
                    "message": f"the BenchmarkRun ended {phase}",
                    "lastTransitionTime": c.timestamp(now),
                }
            ]
        },
    }


def _kueue_condition(type_: str, status: bool, reason: str, message: str, now: datetime) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": c.timestamp(now),
    }


def pods_ready_patch(now: datetime) -> dict[str, Any]:
    """A server-side apply of the Workload's ``PodsReady`` True (``Started``: every worker Ready, the launcher
    running): Kueue's ``waitForPodsReady`` no longer times the Workload out."""
    cond = _kueue_condition(PODS_READY, True, "Started", "every worker is Ready and the launcher runs", now)
    return {"apiVersion": API_VERSION, "kind": "Workload", "status": {"conditions": [cond]}}


def release_patch(workload: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """A merge patch (guarded by the Workload's resourceVersion) that gives an evicted Workload's quota back once
    the run's pods are gone, as Kueue's job integrations do: no admission, ``QuotaReserved`` and ``Admitted``
    False, ``Requeued`` (True at once after a preemption; False with the eviction's reason otherwise, until
    Kueue's requeuing backoff ends) and ``PodsReady`` False (the next admission waits for a fresh start)."""
    evicted = _condition(workload, EVICTED) or {}
    reason, message = str(evicted.get("reason") or EVICTED), str(evicted.get("message") or "evicted")
    replaced = {
        QUOTA_RESERVED: _kueue_condition(QUOTA_RESERVED, False, "Pending", message, now),
        ADMITTED: _kueue_condition(ADMITTED, False, "NoReservation", "the quota was released", now),
        REQUEUED: _kueue_condition(REQUEUED, reason in _REQUEUED_AT_ONCE, reason, message, now),
        PODS_READY: _kueue_condition(PODS_READY, False, "WaitForStart", "the run's pods were released", now),
    }
    kept = [x for x in (workload.get("status") or {}).get("conditions") or [] if x.get("type") not in replaced]
    return {
        "metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]},
        "status": {"admission": None, "conditions": kept + list(replaced.values())},
    }
