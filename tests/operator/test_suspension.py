"""spec.suspend, spec.managedBy and a queue's gate, decided without a cluster (run/suspension.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mlbench_api.run import MANAGED_BY_OPERATOR
from mlbench_api.runstatus import Phase
from mlbench_operator import conditions as c
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodPhase, PodView
from mlbench_operator.run import admission, suspension
from mlbench_operator.run.kueue import Admission
from tests.operator import helpers as h

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("managed_by", "ours"),
    [(None, True), (MANAGED_BY_OPERATOR, True), ("kueue.x-k8s.io/multikueue", False), ("", False)],
)
def test_managed_by(managed_by: str | None, ours: bool) -> None:
    spec = {} if managed_by is None else {"managedBy": managed_by}
    assert suspension.managed_here(spec) is ours


@pytest.mark.parametrize(
    ("spec", "queued", "reason"),
    [
        ({}, None, None),
        ({"suspend": False}, None, None),
        ({"suspend": True}, None, Reason.SUSPENDED),
        ({}, Admission(False, "queue q: insufficient quota"), Reason.QUEUED),
        ({}, Admission(True, "admitted"), None),
        ({"suspend": True}, Admission(True, "admitted"), Reason.SUSPENDED),  # the user's suspend wins
        (
            {},
            Admission(False, "queue q: Exceeded the PodsReady timeout", evicted="PodsReadyTimeout"),
            Reason.PODS_READY_TIMEOUT,
        ),
        ({}, Admission(False, "queue q: Preempted", evicted="Preempted"), Reason.QUEUED),
    ],
)
def test_gate(spec: dict[str, Any], queued: Admission | None, reason: Reason | None) -> None:
    held = suspension.gate(spec, queued)
    assert (held.reason if held else None) == reason
    if queued is not None and reason in (Reason.QUEUED, Reason.PODS_READY_TIMEOUT):
        assert held is not None
        assert held.message == queued.message


def _pod(name: str, rank: int | None, attempt: int = 0, **kw: Any) -> PodView:
    role = "worker" if rank is not None else "launcher"
    kw.setdefault("uid", f"pod-{name}")
    return PodView(name=name, role=role, rank=rank, attempt=attempt, owner_uid="uid-r1", **kw)


def _running_run() -> dict[str, Any]:
    body = h.run(suspend=True)
    body["status"] = {"phase": "Running", "restarts": 0, "startTime": "2026-01-01T11:00:00Z"}
    return body


def test_a_running_run_that_is_suspended_releases_its_pods_and_moves_to_a_new_attempt() -> None:
    pods = [
        _pod("r1-worker-0", 0, phase=PodPhase.RUNNING),
        _pod("r1-worker-1", 1, terminating=True),
        _pod("r1-launcher", None, phase=PodPhase.RUNNING),
        PodView(name="other", role="worker", rank=0, attempt=0, owner_uid="someone-else", uid="x"),
    ]
    held = suspension.Gate(Reason.SUSPENDED, "spec.suspend is true")
    plan = suspension.held_plan(_running_run(), "uid-r1", pods, held, NOW)
    assert plan.delete_stale == {"r1-launcher": "pod-r1-launcher", "r1-worker-0": "pod-r1-worker-0"}
    st = plan.status
    assert st["phase"] == Phase.SUSPENDED
    assert (st["restarts"], st["disruptionRestarts"]) == (1, 1)  # not against maxRestarts
    cond = c.get(st["conditions"], c.SUSPENDED)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", Reason.SUSPENDED)
    assert c.get(st["conditions"], c.WORKERS_READY)["reason"] == Reason.SUSPENDED  # type: ignore[index]
    assert [e[1] for e in plan.events] == [Reason.SUSPENDED]


def test_a_run_held_before_it_started_keeps_its_attempt() -> None:
    body = h.run(suspend=True)
    body["status"] = {"phase": "Pending", "restarts": 0}
    held = suspension.Gate(Reason.QUEUED, "queue q: waiting")
    plan = suspension.held_plan(body, "uid-r1", [], held, NOW)
    assert plan.delete_stale == {}
    assert plan.status["restarts"] == 0
    assert "disruptionRestarts" not in plan.status
    assert c.get(plan.status["conditions"], c.SUSPENDED)["message"] == "queue q: waiting"  # type: ignore[index]
    # said once: the same gate again makes no second Event
    body["status"] = plan.status
    assert suspension.held_plan(body, "uid-r1", [], held, NOW).events == []


@pytest.mark.parametrize(
    ("queued", "reason"), [(None, Reason.RESUMED), (Admission(True, "admitted by Kueue", ("f",)), Reason.ADMITTED)]
)
def test_resume_starts_the_clock_again(queued: Admission | None, reason: Reason) -> None:
    body = h.run()
    body["status"] = {"phase": "Suspended", "restarts": 1, "startTime": "2026-01-01T11:00:00Z"}
    st = suspension.resumed_status(body, queued, NOW)
    assert st is not None
    assert st["phase"] == Phase.PENDING
    assert st["startTime"] == "2026-01-01T12:00:00Z"  # the active deadline counts from the resume
    assert c.get(st["conditions"], c.SUSPENDED)["reason"] == reason  # type: ignore[index]


def test_a_run_that_was_not_held_is_not_resumed() -> None:
    body = h.run()
    body["status"] = {"phase": "Running", "restarts": 0}
    assert suspension.resumed_status(body, None, NOW) is None


@pytest.mark.parametrize(
    ("scheduling", "refused"),
    [
        (None, False),
        ({"nodeSelector": {"kubernetes.io/arch": "amd64"}}, False),
        ({"nodeSelector": {"not-allowed": "x"}}, True),
    ],
)
def test_scheduling_changed_while_suspended_meets_the_policy_again(
    scheduling: dict[str, Any] | None, refused: bool
) -> None:
    body = h.run()
    if scheduling is not None:
        body["spec"]["scheduling"] = scheduling
    rejection = admission.scheduling_rejection(body)
    assert (rejection is not None) is refused
    if rejection is not None:
        assert rejection.reason == Reason.POLICY_VIOLATION
        assert "nodeSelector" in rejection.message  # names the field


def test_a_pods_ready_timeout_keeps_why_the_workers_were_not_ready() -> None:
    body = _running_run()
    why = "1/2 workers not ready (Unschedulable: 1)"
    body["status"] = {
        "phase": "Pending",
        "restarts": 0,
        "conditions": [
            {
                "type": c.WORKERS_READY,
                "status": "False",
                "reason": Reason.UNSCHEDULABLE,
                "message": why,
                "lastTransitionTime": "2026-01-01T11:00:00Z",
            }
        ],
    }
    pods = [_pod("r1-worker-0", 0, phase=PodPhase.PENDING)]
    held = suspension.Gate(Reason.PODS_READY_TIMEOUT, "queue q: Exceeded the PodsReady timeout")
    plan = suspension.held_plan(body, "uid-r1", pods, held, NOW)
    ready = c.get(plan.status["conditions"], c.WORKERS_READY)
    assert ready is not None
    assert ready["reason"] == Reason.PODS_READY_TIMEOUT
    assert ready["message"].endswith(f"they were not Ready: {why}")
    assert (plan.status["restarts"], plan.status["disruptionRestarts"]) == (1, 1)  # not against maxRestarts
    body["status"] = plan.status  # the next pass (no pods left) keeps the story
    again = c.get(suspension.held_plan(body, "uid-r1", [], held, NOW).status["conditions"], c.WORKERS_READY)
    assert again is not None
    assert again["message"] == ready["message"]


def _started_status(restarts: int = 1, record: str | None = "pod-r1-launcher", ready: str | None = None) -> dict:
    """A run in attempt ``restarts``: its launcher ``record`` (a UID) recorded, or none and WorkersReady True since
    ``ready``."""
    status: dict[str, Any] = {"phase": "Running", "restarts": restarts}
    if record is not None:
        status["launcher"] = {"uid": record, "attempt": restarts}
    if ready is not None:
        status["conditions"] = [
            {"type": "WorkersReady", "status": "True", "reason": "AllReady", "lastTransitionTime": ready}
        ]
    return status


RUNNING = PodPhase.RUNNING


@pytest.mark.parametrize(
    ("launcher", "status", "started"),
    [
        (_pod("r1-launcher", None, attempt=1, phase=RUNNING), _started_status(), True),  # the recorded launcher
        (_pod("r1-launcher", None, attempt=1, phase=RUNNING), _started_status(restarts=0), False),  # another attempt
        (_pod("r1-launcher", None, attempt=1), _started_status(), False),  # still Pending
        (_pod("r1-launcher", None, attempt=1, phase=RUNNING, terminating=True), _started_status(), False),
        # a forged launcher (the run's marks, another UID) never tells Kueue the pods are ready
        (_pod("r1-launcher", None, attempt=1, phase=RUNNING, uid="u-forged"), _started_status(), False),
        # no record: created once the workers were Ready (as the operator does), or before (forged)
        (
            _pod("r1-launcher", None, attempt=1, phase=RUNNING, created="2026-01-01T12:00:05Z"),
            _started_status(record=None, ready="2026-01-01T12:00:00Z"),
            True,
        ),
        (
            _pod("r1-launcher", None, attempt=1, phase=RUNNING, created="2026-01-01T11:59:00Z"),
            _started_status(record=None, ready="2026-01-01T12:00:00Z"),
            False,
        ),
    ],
)
def test_attempt_started(launcher: PodView, status: dict[str, Any], started: bool) -> None:
    assert suspension.attempt_started([launcher], "uid-r1", status) is started


def test_pods_gone() -> None:
    assert not suspension.pods_gone([_pod("r1-worker-0", 0, terminating=True)], "uid-r1")
    foreign = PodView(name="x", role="worker", rank=0, attempt=0, owner_uid="someone-else", uid="x")
    assert suspension.pods_gone([foreign], "uid-r1")
