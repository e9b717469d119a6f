"""A Kueue Workload that is deactivated (``spec.active`` false: waitForPodsReady's requeuing backoffLimitCount spent,
or an admin) ends the run Failed/WorkloadDeactivated with Kueue's message and its pods released (no cluster:
run/kueue.py reads the Workload, run/suspension.py decides)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mlbench_api.runstatus import Phase
from mlbench_operator import conditions as c
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodPhase, PodView
from mlbench_operator.run import kueue, suspension
from mlbench_operator.run.kueue import Admission
from tests.operator import helpers as h

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
LIMIT = "The workload is deactivated due to exceeding the maximum number of re-queuing retries"
BY_HAND = "The workload is deactivated"


def cond(type_: str, status: str, reason: str = "X", message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def workload(active: bool | None, *conditions: dict[str, str], admission: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"queueName": "q"} if active is None else {"queueName": "q", "active": active}
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admission:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": []}
    return {"spec": spec, "status": status}


ADMITTED = (cond("QuotaReserved", "True"), cond("Admitted", "True"))


@pytest.mark.parametrize(
    ("wl", "deactivated", "says"),
    [
        # (the Workload as Kueue leaves it, deactivated?, what the run's message says)
        (workload(None, *ADMITTED, admission=True), False, "admitted by Kueue"),
        (workload(True, cond("QuotaReserved", "False", "Pending", "insufficient cpu")), False, "insufficient cpu"),
        # a queued Workload deactivated by hand, once Kueue has evicted it
        (workload(False, cond("Evicted", "True", "Deactivated", BY_HAND)), True, BY_HAND),
        # waitForPodsReady's backoffLimitCount spent (Kueue deactivates an admitted Workload, then evicts it)
        (
            workload(False, *ADMITTED, cond("Evicted", "True", "DeactivatedDueToRequeuingLimitExceeded", LIMIT)),
            True,
            LIMIT,
        ),
        # deactivated while evicted for another reason (Kueue does not evict it again): still final
        (
            workload(False, cond("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout ns/wl")),
            True,
            "spec.active is false (deactivated) after Kueue evicted it: Exceeded the PodsReady timeout",
        ),
        # spec.active false, Kueue has not acted yet: not concluded (Kueue's message comes with its eviction)
        (workload(False, *ADMITTED, admission=True), False, "admitted by Kueue"),
        (workload(False), False, "waiting for Kueue"),
        # reactivated (Kueue's Requeued True, reason Reactivated), the old eviction still True: not deactivated
        (workload(True, cond("Evicted", "True", "Deactivated", BY_HAND)), False, BY_HAND),
    ],
)
def test_a_deactivated_workload_is_read_with_kueues_message(wl: dict[str, Any], deactivated: bool, says: str) -> None:
    got = kueue.admission(wl, "wl", "q")
    assert got.deactivated is deactivated
    assert says in got.message, got.message
    if deactivated:
        assert not got.admitted


def pod(name: str, rank: int | None, **kw: Any) -> PodView:
    role = "worker" if rank is not None else "launcher"
    return PodView(name=name, role=role, rank=rank, attempt=0, owner_uid="uid-r1", uid=f"pod-{name}", **kw)


@pytest.mark.parametrize(
    ("phase", "pods", "released"),
    [
        # (the run's phase, its pods, the pods deleted: the unfinished ones of its own, whatever cleanPodPolicy says)
        ("Suspended", [], {}),
        (
            "Running",
            [
                pod("r1-worker-0", 0, phase=PodPhase.RUNNING),
                pod("r1-worker-1", 1, terminating=True),
                pod("r1-launcher", None, phase=PodPhase.FAILED),
                PodView(name="other", role="worker", rank=0, attempt=0, owner_uid="someone", uid="x"),
            ],
            {"r1-worker-0": "pod-r1-worker-0"},
        ),
    ],
)
def test_a_deactivated_run_fails_with_kueues_message_and_releases_its_pods(
    phase: str, pods: list[PodView], released: dict[str, str]
) -> None:
    body = h.run(runPolicy={"cleanPodPolicy": "None"})
    body["status"] = {"phase": phase, "restarts": 0}
    queued = Admission(False, f"queue q, Workload wl: {LIMIT}", evicted="DeactivatedDueTo...", deactivated=True)
    plan = suspension.deactivated_plan(body, "uid-r1", pods, queued, NOW)
    assert plan is not None
    assert plan.terminal
    assert plan.status["phase"] == Phase.FAILED
    failed = c.get(plan.status["conditions"], c.FAILED)
    assert failed is not None
    assert (failed["status"], failed["reason"]) == ("True", Reason.WORKLOAD_DEACTIVATED)
    assert LIMIT in failed["message"]
    assert LIMIT in plan.status["message"]
    assert plan.delete_stale == released
    assert plan.events == [("Warning", Reason.WORKLOAD_DEACTIVATED, failed["message"])]


@pytest.mark.parametrize(
    "queued",
    [
        Admission(False, "queue q: insufficient quota"),
        Admission(True, "admitted"),
        Admission(False, "queue q: Exceeded the PodsReady timeout", evicted="PodsReadyTimeout"),
    ],
)
def test_a_workload_that_is_not_deactivated_ends_nothing(queued: Admission) -> None:
    body = h.run()
    body["status"] = {"phase": "Suspended", "restarts": 0}
    assert suspension.deactivated_plan(body, "uid-r1", [], queued, NOW) is None


@pytest.mark.parametrize(
    ("reason", "says"),
    [
        ("Deactivated", BY_HAND),
        ("DeactivatedDueToRequeuingLimitExceeded", BY_HAND),
        ("InactiveWorkload", BY_HAND),  # Kueue releases before the Deactivated... reasons
        ("PodsReadyTimeout", f"spec.active is false (deactivated) after Kueue evicted it: {BY_HAND}"),
    ],
)
def test_the_failure_says_kueues_words_for_its_deactivation(reason: str, says: str) -> None:
    assert kueue.deactivation_message({"reason": reason, "message": BY_HAND}) == says
