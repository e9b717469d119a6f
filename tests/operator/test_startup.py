"""The startup deadline (runPolicy.startupDeadlineSeconds): the pure clock, the reason summary and the backoff
(mlbench_operator.run.startup) as tables, then the planner's release, backoff, retry and failure."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mlbench_api.contract import Reason
from mlbench_api.runpolicy import CleanPodPolicy, RunPolicy
from mlbench_operator import conditions as c
from mlbench_operator import runcontext, runpods
from mlbench_operator.podview import PodView
from mlbench_operator.run import admission, lifecycle, planinput, policies, restarting, startup
from mlbench_operator.run.status import Plan
from tests.operator import helpers as h

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
CREATED = "2026-01-01T12:00:00Z"  #: T0, as the API server writes a creationTimestamp
NO_NODE = "0/3 nodes are available: 3 Insufficient cpu."


def _admitted(**run_policy: Any) -> tuple[dict[str, Any], runcontext.RunContext]:
    body = h.run(runPolicy=run_policy) if run_policy else h.run()
    result = admission.admit(body, h.task())
    assert not isinstance(result, admission.Rejection), result
    ctx, snapshot = result
    return {**body, "status": admission.admitted_status(body, ctx, snapshot, T0)}, ctx


def _pod(obj: dict[str, Any], *, ready: bool = False, phase: str = "Pending", **status: Any) -> PodView:
    """A pod from the builders, created at T0, with a kubelet-like status (not Ready unless said)."""
    conds = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True" if ready else "False"}]
    obj = {**obj, "status": {"phase": phase, "conditions": conds, **status}}
    obj["metadata"] = {**obj["metadata"], "creationTimestamp": CREATED}
    view = PodView.from_pod(obj)
    assert view is not None
    return view


def _unschedulable(obj: dict[str, Any]) -> PodView:
    conds = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_NODE}]
    return _pod(obj, conditions=conds)


def _pulling(obj: dict[str, Any]) -> PodView:
    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}
    return _pod(obj, containerStatuses=[{"name": "worker", "state": {"waiting": waiting}}])


def _ready(obj: dict[str, Any]) -> PodView:
    return _pod(obj, ready=True, phase="Running")


def _world(ctx: runcontext.RunContext, attempt: int = 0) -> list[PodView]:
    """Worker 0 Ready, worker 1 Unschedulable: a half-started world holding worker 0's node."""
    return [_ready(runpods.worker_pod(ctx, 0, attempt)), _unschedulable(runpods.worker_pod(ctx, 1, attempt))]


def _step(body: dict[str, Any], ctx: runcontext.RunContext, pods: list[PodView], now: datetime) -> Plan:
    return policies.plan(body, ctx, pods, now)


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found = c.get(status["conditions"], type_)
    assert found is not None, type_
    return found


# -- the pure decisions -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("deadline", "launcher", "created", "elapsed", "expected"),
    [
        pytest.param(None, None, CREATED, 0, 600.0, id="default: 600 s"),
        pytest.param(60, None, CREATED, 59, 1.0, id="before the deadline"),
        pytest.param(60, None, CREATED, 60, 0.0, id="at the deadline: passed"),
        pytest.param(60, None, CREATED, 90, -30.0, id="past it"),
        pytest.param(60, None, None, 10**6, None, id="no creation time: no clock"),
        pytest.param(60, "Pending", CREATED, 90, -30.0, id="a pending launcher has not started"),
        pytest.param(60, "Running", CREATED, 90, None, id="a running launcher: started"),
        pytest.param(60, "Failed", CREATED, 90, None, id="an ended launcher: the failure decides"),
    ],
)
def test_the_startup_clock(
    deadline: int | None, launcher: str | None, created: str | None, elapsed: float, expected: float | None
) -> None:
    worker = PodView(name="r-worker-0", role="worker", rank=0, attempt=0, created=created)
    pod = None
    if launcher is not None:
        pod = PodView(name="r-launcher", role="launcher", rank=None, attempt=0, phase=launcher)
    policy = RunPolicy.model_validate({"startupDeadlineSeconds": deadline})
    assert startup.left(policy, [worker], pod, T0 + timedelta(seconds=elapsed)) == expected


def test_the_clock_starts_at_the_earliest_pod_still_there() -> None:
    early = PodView(name="a", role="worker", rank=0, attempt=0, created="2026-01-01T11:59:00Z")
    late = PodView(name="b", role="worker", rank=1, attempt=0, created="2026-01-01T12:00:30Z")
    going = dataclasses.replace(early, created="2026-01-01T11:00:00Z", terminating=True)
    assert startup.clock_start([late, early, going]) == T0 - timedelta(seconds=60)
    assert startup.clock_start([]) is None


@pytest.mark.parametrize(
    ("base", "timeouts", "expected"),
    [(60, 1, 60), (60, 2, 120), (60, 3, 240), (60, 7, 3600), (60, 1000, 3600), (0, 3, 0), (5, 0, 0)],
)
def test_the_backoff_doubles_up_to_an_hour(base: int, timeouts: int, expected: int) -> None:
    assert startup.backoff(RunPolicy.model_validate({"startupBackoffSeconds": base}), timeouts) == expected


MOUNT = {"r1-worker-1": (Reason.FAILED_MOUNT, 'configmap "gone" not found')}


@pytest.mark.parametrize(
    ("pods", "mounts", "expected"),
    [
        pytest.param(
            [_ready, _unschedulable],
            {},
            f"1/2 workers not ready (Unschedulable: 1); worker 1 (pod r1-worker-1): Unschedulable: {NO_NODE}",
            id="the scheduler's words",
        ),
        pytest.param(
            [_pulling, _unschedulable],
            {},
            "2/2 workers not ready (ImagePullBackOff: 1, Unschedulable: 1); worker 0 (pod r1-worker-0): "
            f'ImagePullBackOff: Back-off pulling image "nope:1"; worker 1 (pod r1-worker-1): Unschedulable: {NO_NODE}',
            id="a container's waiting reason",
        ),
        pytest.param(
            [_ready, _pod],
            MOUNT,
            "1/2 workers not ready (FailedMount: 1); worker 1 (pod r1-worker-1): FailedMount: "
            'configmap "gone" not found',
            id="a volume's Event",
        ),
        pytest.param(
            [_unschedulable],
            {},
            f"2/2 workers not ready (Unschedulable: 1, NotCreated: 1); worker 0 (pod r1-worker-0): Unschedulable: "
            f"{NO_NODE}",
            id="a worker never created",
        ),
        pytest.param(
            [_ready, _pod],
            {},
            "1/2 workers not ready (Pending: 1); worker 1 (pod r1-worker-1): Pending: no reason reported",
            id="nobody said why",
        ),
    ],
)
def test_why_an_attempt_has_not_started(pods: list[Any], mounts: dict[str, Any], expected: str) -> None:
    _, ctx = _admitted()
    workers = {rank: make(runpods.worker_pod(ctx, rank, 0)) for rank, make in enumerate(pods)}
    assert startup.blockers(workers, None, 2, mounts) == expected


def test_a_launcher_that_does_not_start_is_named() -> None:
    _, ctx = _admitted()
    workers = {r: _ready(runpods.worker_pod(ctx, r, 0)) for r in range(2)}
    launcher = _unschedulable(runpods.launcher_pod(ctx, 0))
    text = startup.blockers(workers, launcher, 2, {})
    head = "0/2 workers not ready, the launcher not running (Unschedulable: 1)"
    assert text == f"{head}; launcher (pod r1-launcher): Unschedulable: {NO_NODE}"


@pytest.mark.parametrize(
    ("policy", "reason", "expected"),
    [
        (CleanPodPolicy.NONE, Reason.STARTUP_DEADLINE_EXCEEDED, CleanPodPolicy.RUNNING),
        (CleanPodPolicy.NONE, Reason.WORKER_FAILED, CleanPodPolicy.NONE),
        (CleanPodPolicy.ALL, Reason.STARTUP_DEADLINE_EXCEEDED, CleanPodPolicy.ALL),
        (CleanPodPolicy.RUNNING, Reason.STARTUP_DEADLINE_EXCEEDED, CleanPodPolicy.RUNNING),
    ],
)
def test_a_run_that_never_started_releases_its_pods_whatever_the_policy(
    policy: CleanPodPolicy, reason: str, expected: CleanPodPolicy
) -> None:
    failed = c.set_condition([], c.FAILED, "True", reason, "m", now=T0)
    status = {"phase": "Failed", "conditions": failed}
    body = {"spec": {"runPolicy": {"cleanPodPolicy": policy.value}}, "status": status}
    assert lifecycle.end_policy(body) is expected


# -- the planner ------------------------------------------------------------------------------------------------
def test_past_the_deadline_the_pods_are_released_and_a_retry_waits_for_its_backoff() -> None:
    body, ctx = _admitted(startupDeadlineSeconds=60, startupBackoffSeconds=30, maxRestarts=0)
    pods = _world(ctx)
    plan = _step(body, ctx, pods, T0 + timedelta(seconds=59))
    assert (plan.status["phase"], plan.delete_stale, plan.requeue_after) == ("Pending", {}, 1.0)  # wakes at it

    plan = _step(body, ctx, pods, T0 + timedelta(seconds=60))
    st = plan.status
    assert (st["phase"], st["restarts"], st["startupTimeouts"]) == ("Pending", 1, 1)
    assert st["startupRetryAt"] == "2026-01-01T12:01:30Z"  # 60 s + the 30 s backoff
    assert sorted(plan.delete_stale) == ["r1-worker-0", "r1-worker-1"]  # nothing holds a node
    for type_ in (c.WORKERS_READY, c.RESTARTED):
        assert _cond(st, type_)["reason"] == "StartupDeadlineExceeded"
        assert f"Unschedulable: {NO_NODE}" in _cond(st, type_)["message"]
    assert "startup retry 1/3 in 30 s" in st["message"]
    assert plan.events == [("Warning", "StartupDeadlineExceeded", st["message"])]

    body = {**body, "status": st}
    plan = _step(body, ctx, [dataclasses.replace(p, terminating=True) for p in pods], T0 + timedelta(seconds=61))
    assert plan.create_workers == []  # the stale pods first
    plan = _step(body, ctx, [], T0 + timedelta(seconds=62))
    assert (plan.create_workers, plan.requeue_after) == ([], 28.0)  # the backoff
    assert _cond(plan.status, c.WORKERS_READY)["reason"] == "StartupDeadlineExceeded"  # still says why
    plan = _step(body, ctx, [], T0 + timedelta(seconds=90))
    assert plan.create_workers == [0, 1]


def test_a_startup_retry_does_not_spend_max_restarts() -> None:
    body, ctx = _admitted(startupDeadlineSeconds=60, startupBackoffSeconds=0, maxRestarts=0)
    body = {**body, "status": _step(body, ctx, _world(ctx), T0 + timedelta(seconds=60)).status}
    assert body["status"]["restarts"] == 1
    crashed = PodView(
        name="r1-worker-1", role="worker", rank=1, attempt=1, phase="Failed", exit_code=1, owner_uid=ctx.uid
    )
    plan = _step(body, ctx, [_ready(runpods.worker_pod(ctx, 0, 1)), crashed], T0 + timedelta(seconds=70))
    assert plan.status["phase"] == "Failed"
    assert "gave up after 0 of maxRestarts=0 restarts" in plan.status["message"]  # the timeout did not count


def test_once_the_retries_are_spent_the_run_fails_and_releases_everything() -> None:
    body, ctx = _admitted(startupDeadlineSeconds=60, startupRetries=1, cleanPodPolicy="None")
    body["status"] = {**body["status"], "restarts": 1, "startupTimeouts": 1}
    pods = _world(ctx, attempt=1)
    plan = _step(body, ctx, pods, T0 + timedelta(seconds=60))
    st = plan.status
    assert (st["phase"], _cond(st, c.FAILED)["reason"]) == ("Failed", "StartupDeadlineExceeded")
    assert "gave up after 1 of startupRetries=1" in st["message"]
    assert f"Unschedulable: {NO_NODE}" in st["message"]
    assert plan.cleanup == ["r1-worker-0", "r1-worker-1"]  # even under cleanPodPolicy None
    assert lifecycle.cleanup_pending({**body, "status": st}, pods) == ["r1-worker-0", "r1-worker-1"]


def test_an_attempt_that_starts_in_time_is_unaffected() -> None:
    body, ctx = _admitted(startupDeadlineSeconds=60)
    launcher = dataclasses.replace(_ready(runpods.launcher_pod(ctx, 0)), uid="uid-launcher")
    body["status"] = {**body["status"], "launcher": {"uid": "uid-launcher", "attempt": 0}}
    pods = [*(_ready(runpods.worker_pod(ctx, r, 0)) for r in range(2)), launcher]
    plan = _step(body, ctx, pods, T0 + timedelta(seconds=3600))
    st = plan.status
    assert (st["phase"], st.get("startupTimeouts"), plan.delete_stale) == ("Running", None, {})


def test_an_attempt_that_has_run_is_past_the_clock() -> None:
    """Once the attempt was Running, a vanished or stopping launcher is a gang restart's business, never a
    startup timeout (however long ago its pods were created)."""
    body, ctx = _admitted(startupDeadlineSeconds=60)
    late = T0 + timedelta(seconds=3600)
    inp = planinput.PlanInput.of(body, ctx, _world(ctx), late)
    assert inp.startup_left == -3540.0
    running = c.set_condition(body["status"]["conditions"], c.RUNNING, "True", Reason.LAUNCHER_RUNNING, "", now=T0)
    body["status"] = {**body["status"], "conditions": running}
    inp = planinput.PlanInput.of(body, ctx, _world(ctx), late)
    assert inp.startup_left is None
    assert restarting.startup_deadline(inp) is None


def test_workers_never_created_say_why() -> None:
    """A create the API server refused (a quota) is why a worker never came: the release says so."""
    body, ctx = _admitted(startupDeadlineSeconds=60)
    refused = "pod r1-worker-1: 403 exceeded quota: pods=1"
    conds = c.set_condition(
        body["status"]["conditions"], c.WORKERS_READY, "False", Reason.CREATE_FAILED, refused, now=T0
    )
    body["status"] = {**body["status"], "conditions": conds}
    plan = _step(body, ctx, [_ready(runpods.worker_pod(ctx, 0, 0))], T0 + timedelta(seconds=60))
    text = _cond(plan.status, c.RESTARTED)["message"]
    assert text.endswith(f"1/2 workers not ready (NotCreated: 1); CreateFailed: {refused}"), text
    assert list(plan.delete_stale) == ["r1-worker-0"]
