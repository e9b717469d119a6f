"""The decision logic, without a cluster: admission, the state machine, failures, results, cleanup."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mlbench_operator import builders, reconcile
from mlbench_operator import conditions as c
from mlbench_operator.podview import PodView
from tests.operator import helpers as h

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def admitted(body: dict[str, Any], now: datetime = T0) -> tuple[dict[str, Any], builders.RunContext]:
    result = reconcile.admit(body, h.task())
    assert not isinstance(result, reconcile.Rejection), result
    ctx, snapshot = result
    body = {**body, "status": reconcile.admitted_status(body, ctx, snapshot, now)}
    return body, ctx


def pod(obj: dict[str, Any], phase: str = "Running", ready: bool = True, **status: Any) -> PodView:
    """A pod from the builders with a kubelet-like status."""
    obj = {**obj, "status": {"phase": phase, "podIP": "10.0.0.1", **status}}
    conds = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True" if ready else "False"}]
    obj["status"].setdefault("conditions", conds)
    view = PodView.from_pod(obj)
    assert view is not None
    return view


def terminated(obj: dict[str, Any], code: int, message: str = "", reason: str | None = None) -> PodView:
    term = {"exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error"), "message": message}
    init_done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    return pod(
        obj,
        phase="Succeeded" if code == 0 else "Failed",
        ready=False,
        initContainerStatuses=[{"name": "init", "state": init_done}],  # as kwok/the kubelet report them
        containerStatuses=[{"name": "x", "state": {"terminated": term}}],
    )


def workers(ctx: builders.RunContext, attempt: int = 0, ready: bool = True) -> list[PodView]:
    return [pod(builders.worker_pod(ctx, r, attempt), ready=ready) for r in range(ctx.spec.workers)]


def step(
    body: dict[str, Any], ctx: builders.RunContext, pods: list[PodView], now: datetime = T0
) -> tuple[dict[str, Any], reconcile.Plan]:
    plan = reconcile.plan(body, ctx, pods, now)
    return {**body, "status": plan.status}, plan


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found = c.get(status["conditions"], type_)
    assert found is not None, type_
    return found


# -- admission ---------------------------------------------------------------------------------------------
def test_missing_task_is_rejected() -> None:
    result = reconcile.admit(h.run(), None)
    assert isinstance(result, reconcile.Rejection)
    assert result.reason == "TaskNotFound"
    status = reconcile.rejected_status(h.run(), result, T0)
    assert status["phase"] == "Failed"
    assert cond(status, "Failed")["status"] == "True"
    assert cond(status, "Failed")["reason"] == "TaskNotFound"
    assert "optest-task" in status["message"]


def test_closed_division_override_is_rejected() -> None:
    result = reconcile.admit(h.run(overrides={"momentum": 0.5}), h.task())
    assert isinstance(result, reconcile.Rejection)
    assert result.reason == "OverrideNotAllowed"
    assert "momentum" in result.message


def test_invalid_effective_config_is_rejected() -> None:
    # maxEpochs below a milestone breaks a cross-field rule of the task (open division allows it).
    task = h.task()
    task["spec"]["division"] = "open"
    result = reconcile.admit(h.run(overrides={"maxEpochs": 10}), task)
    assert isinstance(result, reconcile.Rejection)
    assert result.reason == "InvalidConfig"


def test_allowed_override_is_admitted_with_snapshot() -> None:
    body = h.run(overrides={"model": {"name": "resnet", "version": "m2", "depth": 56}})
    result = reconcile.admit(body, h.task())
    assert not isinstance(result, reconcile.Rejection)
    ctx, snapshot = result
    assert snapshot["model"]["depth"] == 20  # the task as it was
    assert ctx.config.task.model.depth == 56  # what the run trains
    status = reconcile.admitted_status(body, ctx, snapshot, T0)
    assert status["phase"] == "Pending"
    assert status["taskSnapshot"] == snapshot
    assert status["workers"] == {"ready": 0, "total": 2}


def test_context_uses_snapshot_not_current_task() -> None:
    body, _ = admitted(h.run())
    snap = body["status"]["taskSnapshot"]
    ctx = reconcile.context(body, snap)
    assert ctx.config.task.training.max_epochs == 164


# -- the happy path ------------------------------------------------------------------------------------------
def test_lifecycle_pending_starting_running_succeeded() -> None:
    body, ctx = admitted(h.run(workers=3))
    body, plan = step(body, ctx, [])
    assert plan.create_workers == [0, 1, 2]
    assert not plan.create_launcher
    assert plan.status["phase"] == "Pending"

    not_ready = workers(ctx, ready=False)
    body, plan = step(body, ctx, not_ready)
    assert plan.status["phase"] == "Starting"
    assert plan.create_workers == []
    assert not plan.create_launcher, "launcher must wait for every worker to be Ready"
    assert cond(plan.status, "WorkersReady")["status"] == "False"

    two_ready = [*workers(ctx)[:2], not_ready[2]]
    body, plan = step(body, ctx, two_ready)
    assert not plan.create_launcher
    assert plan.status["workers"] == {"ready": 2, "total": 3}

    ready = workers(ctx)
    body, plan = step(body, ctx, ready)
    assert plan.create_launcher
    assert cond(plan.status, "WorkersReady")["status"] == "True"
    assert plan.status["phase"] == "Starting"

    launcher = pod(builders.launcher_pod(ctx, 0))
    later = T0 + timedelta(seconds=30)
    body, plan = step(body, ctx, [*ready, launcher], later)
    assert plan.status["phase"] == "Running"
    assert cond(plan.status, "Running")["status"] == "True"
    assert not plan.create_launcher
    # WorkersReady did not flip, so its transition time is unchanged
    assert cond(plan.status, "WorkersReady")["lastTransitionTime"] == c.timestamp(T0)
    assert ("Normal", "Running", plan.status["message"]) in plan.events

    summary = h.summary(world_size=3)
    done = terminated(builders.launcher_pod(ctx, 0), 0, summary.termination_message())
    body["status"]["progress"] = {"epoch": 0.5, "step": 7, "lastAccuracy": 0.1}  # the last scrape, long ago
    body, plan = step(body, ctx, [*ready, done], later)
    st = plan.status
    assert st["phase"] == "Succeeded"
    # kubectl get br shows what the run ended with, not the last scrape
    assert st["progress"]["epoch"] == summary.epochs
    assert st["progress"]["lastAccuracy"] == summary.final_accuracy
    assert st["progress"]["step"] == 7
    assert st["result"]["goalReached"] is True
    assert st["result"]["timeToGoalSeconds"] == 1234.5
    assert st["result"]["worldSize"] == 3
    assert st["completionTime"] == c.timestamp(later)
    assert cond(st, "Succeeded")["status"] == "True"
    assert cond(st, "GoalReached")["status"] == "True"
    assert cond(st, "Failed")["status"] == "False"
    # cleanPodPolicy Running (default): running workers go, the launcher stays for its log
    assert plan.cleanup == ["r1-worker-0", "r1-worker-1", "r1-worker-2"]


def test_goal_not_reached_still_succeeds() -> None:
    body, ctx = admitted(h.run())
    done = terminated(builders.launcher_pod(ctx, 0), 0, h.summary(goal=False).termination_message())
    _, plan = step(body, ctx, [*workers(ctx), done])
    assert plan.status["phase"] == "Succeeded"
    assert cond(plan.status, "GoalReached")["status"] == "False"
    assert cond(plan.status, "GoalReached")["reason"] == "GoalNotReached"


@pytest.mark.parametrize(
    ("message", "needle"), [("", "no termination message"), ("{not json", "not JSON"), ('{"run": "r1"}', "status")]
)
def test_malformed_result_is_invalid_result(message: str, needle: str) -> None:
    body, ctx = admitted(h.run())
    done = terminated(builders.launcher_pod(ctx, 0), 0, message)
    _, plan = step(body, ctx, [*workers(ctx), done])
    assert plan.status["phase"] == "Failed"
    assert cond(plan.status, "Failed")["reason"] == "InvalidResult"
    assert needle in plan.status["message"]
    assert "result" not in plan.status


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("All", ["r1-launcher", "r1-worker-0", "r1-worker-1"]), ("None", []), ("Running", ["r1-worker-0", "r1-worker-1"])],
)
def test_clean_pod_policy(policy: str, expected: list[str]) -> None:
    body, ctx = admitted(h.run(runPolicy={"cleanPodPolicy": policy}))
    done = terminated(builders.launcher_pod(ctx, 0), 0, h.summary().termination_message())
    _, plan = step(body, ctx, [*workers(ctx), done])
    assert plan.cleanup == expected


# -- failures -------------------------------------------------------------------------------------------------
def test_worker_failure_restarts_the_gang_then_gives_up() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 1}))
    launcher = pod(builders.launcher_pod(ctx, 0))
    oom = terminated(builders.worker_pod(ctx, 1, 0), 137, reason="OOMKilled")
    body, plan = step(body, ctx, [workers(ctx)[0], oom, launcher])
    assert plan.status["restarts"] == 1
    assert plan.status["phase"] == "Pending"
    assert plan.delete_stale
    assert "OOMKilled" in plan.status["message"]
    assert "r1-worker-1" in plan.status["message"]
    assert cond(plan.status, "Restarted")["reason"] == "OOMKilled"
    assert plan.events[0][:2] == ("Warning", "Restarting")

    # the old world is still terminating: no new pods with the same names yet
    body, plan = step(body, ctx, [workers(ctx)[0], oom, launcher])
    assert plan.create_workers == []
    assert plan.delete_stale

    # gone: the new attempt's workers are created
    body, plan = step(body, ctx, [])
    assert plan.create_workers == [0, 1]

    # fails again: maxRestarts=1 exhausted -> Failed with the real cause
    new = workers(ctx, attempt=1)
    failed_launcher = terminated(
        builders.launcher_pod(ctx, 1), 1, '{"error":"mpirun exited with 1; last output: boom","exitCode":1}'
    )
    body, plan = step(body, ctx, [*new, failed_launcher])
    st = plan.status
    assert st["phase"] == "Failed"
    assert cond(st, "Failed")["reason"] == "LauncherFailed"
    assert "mpirun exited with 1" in st["message"]
    assert "exit code 1" in st["message"]
    assert "maxRestarts=1" in st["message"]
    assert plan.cleanup == ["r1-worker-0", "r1-worker-1"]  # failed launcher kept for its log


def test_evicted_worker_names_the_cause() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 0}))
    evicted = pod(
        builders.worker_pod(ctx, 0, 0),
        phase="Failed",
        ready=False,
        reason="Evicted",
        message="The node was low on resource: memory.",
    )
    _, plan = step(body, ctx, [evicted, workers(ctx)[1]])
    assert plan.status["phase"] == "Failed"
    assert cond(plan.status, "Failed")["reason"] == "Evicted"
    assert "low on resource" in plan.status["message"]


def test_worker_lost_while_running_is_a_failure() -> None:
    body, ctx = admitted(h.run(workers=2, runPolicy={"maxRestarts": 2}))
    _, plan = step(body, ctx, [workers(ctx)[0], pod(builders.launcher_pod(ctx, 0))])
    assert plan.status["restarts"] == 1
    assert "r1-worker-1" in plan.status["message"]


def test_launcher_lost_while_running_is_a_failure() -> None:
    body, ctx = admitted(h.run(workers=1, runPolicy={"maxRestarts": 2}))
    body, plan = step(body, ctx, [*workers(ctx), pod(builders.launcher_pod(ctx, 0))])
    assert plan.status["phase"] == "Running"
    _, plan = step(body, ctx, workers(ctx))
    assert plan.status["restarts"] == 1
    assert cond(plan.status, "Restarted")["reason"] == "LauncherLost"
    assert not plan.create_launcher


def test_launcher_dns_wait_failure_is_shown() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 0}))
    obj = builders.launcher_pod(ctx, 0)
    term = {"exitCode": 1, "reason": "Error", "message": "worker r1-worker-1.r1.ns.svc does not resolve after 300s"}
    launcher = pod(
        obj,
        phase="Failed",
        ready=False,
        initContainerStatuses=[{"name": "wait-for-workers", "state": {"terminated": term}}],
        containerStatuses=[{"name": "launcher", "state": {"waiting": {"reason": "PodInitializing"}}}],
    )
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert plan.status["phase"] == "Failed"
    assert "does not resolve" in plan.status["message"]


def test_aborted_run_fails_without_restart() -> None:
    body, ctx = admitted(h.run())
    aborted = h.summary().model_copy(update={"status": "aborted", "goal_reached": False, "stop_reason": "diverged"})
    launcher = terminated(builders.launcher_pod(ctx, 0), 3, aborted.termination_message())
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert plan.status["phase"] == "Failed"
    assert plan.status["restarts"] == 0
    assert cond(plan.status, "Failed")["reason"] == "Aborted"
    assert "diverged" in plan.status["message"]
    assert plan.status["result"]["goalReached"] is False


def test_deadline_exceeded() -> None:
    body, ctx = admitted(h.run(runPolicy={"activeDeadlineSeconds": 60}))
    _, plan = step(body, ctx, workers(ctx), T0 + timedelta(seconds=30))
    assert plan.requeue_after == pytest.approx(30)
    _, plan = step(body, ctx, workers(ctx), T0 + timedelta(seconds=61))
    assert plan.status["phase"] == "Failed"
    assert cond(plan.status, "Failed")["reason"] == "DeadlineExceeded"


def test_unschedulable_workers_show_as_condition() -> None:
    body, ctx = admitted(h.run(resources={"gpu": 4}))
    msg = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    stuck = PodView.from_pod(
        {
            **builders.worker_pod(ctx, 0, 0),
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}],
            },
        }
    )
    assert stuck is not None
    _, plan = step(body, ctx, [stuck, workers(ctx)[1]])
    wr = cond(plan.status, "WorkersReady")
    assert (wr["status"], wr["reason"]) == ("False", "Unschedulable")
    assert msg in wr["message"]
    assert plan.status["phase"] == "Pending"
    assert ("Warning", "Unschedulable", wr["message"]) in plan.events


def test_ttl() -> None:
    status = {"completionTime": c.timestamp(T0)}
    assert reconcile.ttl_expired(status, None, T0) is None
    assert reconcile.ttl_expired(status, 60, T0 + timedelta(seconds=10)) == pytest.approx(50)
    left = reconcile.ttl_expired(status, 60, T0 + timedelta(seconds=70))
    assert left is not None
    assert left < 0
    # stored before the CRD bounded it: no OverflowError on every pass, just "not yet"
    far = reconcile.ttl_expired(status, 10**14, T0)
    assert far is not None
    assert far == pytest.approx(2**31 - 1)


def test_status_patch_only_changed_keys() -> None:
    assert reconcile.status_patch({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == {"b": 3, "c": 4}


# -- review fixes ------------------------------------------------------------------------------------------------
def finished_body(body: dict[str, Any], plan: reconcile.Plan) -> dict[str, Any]:
    return {**body, "status": plan.status}


def test_cleanup_is_derived_from_the_cluster_after_the_final_status() -> None:
    """A finished run whose pods were not (all) deleted yet still has its cleanup pending: re-driven
    after an operator restart, and the result is never re-planned (no LauncherLost restart)."""
    body, ctx = admitted(h.run(runPolicy={"cleanPodPolicy": "All"}))
    done = terminated(builders.launcher_pod(ctx, 0), 0, h.summary().termination_message())
    pods = [*workers(ctx), done]
    body, plan = step(body, ctx, pods)
    assert plan.terminal
    assert reconcile.cleanup_pending(body, pods) == ["r1-launcher", "r1-worker-0", "r1-worker-1"]
    # the launcher went first and the operator died: what is left is still pending, nothing else
    assert reconcile.cleanup_pending(body, workers(ctx)) == ["r1-worker-0", "r1-worker-1"]
    gone = [dataclasses.replace(p, terminating=True) for p in workers(ctx)]
    assert reconcile.cleanup_pending(body, gone) == []
    closing = reconcile.cleaned_up_status(body, gone, T0)
    assert closing["workers"] == {"ready": 0, "total": 2}
    assert reconcile.CLEANED_UP in cond(closing, "WorkersReady")["message"]
    assert closing["result"] == plan.status["result"]


def test_running_policy_deletes_an_unfinished_launcher() -> None:
    """cleanPodPolicy Running (Kubeflow's meaning): a Pending launcher after DeadlineExceeded goes too."""
    body, ctx = admitted(h.run(runPolicy={"activeDeadlineSeconds": 60}))
    pending = pod(builders.launcher_pod(ctx, 0), phase="Pending", ready=False)
    _, plan = step(body, ctx, [*workers(ctx), pending], T0 + timedelta(seconds=61))
    assert plan.status["phase"] == "Failed"
    assert plan.cleanup == ["r1-launcher", "r1-worker-0", "r1-worker-1"]


def test_waiting_init_container_reason_is_shown() -> None:
    body, ctx = admitted(h.run())
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}}
    launcher = pod(
        builders.launcher_pod(ctx, 0),
        phase="Pending",
        ready=False,
        initContainerStatuses=[{"name": "wait-for-workers", "state": waiting}],
        containerStatuses=[{"name": "launcher", "state": {"waiting": {"reason": "PodInitializing"}}}],
    )
    assert launcher.waiting is not None
    assert "ImagePullBackOff" in launcher.waiting
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert "ImagePullBackOff" in cond(plan.status, "Running")["message"]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_result_is_invalid_result(number: str) -> None:
    body, ctx = admitted(h.run())
    text = h.summary().termination_message().replace('"best_accuracy":0.81', f'"best_accuracy":{number}')
    text = text.replace('"bestAccuracy":0.81', f'"bestAccuracy":{number}')
    assert number in text
    done = terminated(builders.launcher_pod(ctx, 0), 0, text)
    _, plan = step(body, ctx, [*workers(ctx), done])
    assert plan.status["phase"] == "Failed"
    assert cond(plan.status, "Failed")["reason"] == "InvalidResult"
    assert "result" not in plan.status
    json.dumps(plan.status, allow_nan=False)  # what the API server would accept


def test_failed_launcher_with_a_non_aborted_summary_is_not_aborted() -> None:
    """Only status=aborted means 'a restart would repeat it'; a crash after a summary restarts."""
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 1}))
    launcher = terminated(builders.launcher_pod(ctx, 0), 1, h.summary().termination_message())
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert plan.status["phase"] == "Pending"
    assert plan.status["restarts"] == 1
    assert cond(plan.status, "Restarted")["reason"] == "LauncherFailed"


def test_workers_ready_is_false_on_failure() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 0}))
    body, plan = step(body, ctx, [*workers(ctx), pod(builders.launcher_pod(ctx, 0))])
    assert cond(plan.status, "WorkersReady")["status"] == "True"
    failed = terminated(builders.launcher_pod(ctx, 0), 1, '{"error":"boom","exitCode":1}')
    body, plan = step(body, ctx, [*workers(ctx), failed])
    assert plan.status["phase"] == "Failed"
    assert (cond(plan.status, "WorkersReady")["status"], cond(plan.status, "WorkersReady")["reason"]) == (
        "False",
        "RunFailed",
    )
    gone = [dataclasses.replace(p, terminating=True) for p in workers(ctx)]
    assert reconcile.cleaned_up_status(body, [*gone, failed], T0)["workers"] == {"ready": 0, "total": 2}


def test_refused_creates_403_keeps_retrying_with_a_condition_422_fails() -> None:
    body, ctx = admitted(h.run())
    quota = "exceeded quota: q, requested: pods=1, used: pods=10, limited: pods=10"
    plan = reconcile.creation_failed(body, [("pod r1-worker-1", 403, quota)], T0)
    assert not plan.terminal
    wr = cond(plan.status, "WorkersReady")
    assert (wr["status"], wr["reason"]) == ("False", "CreateFailed")
    assert quota in wr["message"]
    assert plan.events
    assert plan.events[0][:2] == ("Warning", "CreateFailed")
    body = finished_body(body, plan)
    # the next pass keeps saying so while the worker is still missing; the same refusal: no new Event
    _, nxt = step(body, ctx, [workers(ctx)[0]])
    assert nxt.create_workers == [1]
    assert cond(nxt.status, "WorkersReady")["reason"] == "CreateFailed"
    assert reconcile.creation_failed(body, [("pod r1-worker-1", 403, quota)], T0).events == []

    invalid = reconcile.creation_failed(
        body, [("pod r1-worker-0", 422, "spec.containers[0].image: Required value")], T0
    )
    assert invalid.terminal
    assert cond(invalid.status, "Failed")["reason"] == "CreateFailed"
    assert "Required value" in invalid.status["message"]


def test_pod_stuck_terminating_on_a_lost_node_is_force_deleted() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 2}))
    body = {**body, "status": {**body["status"], "restarts": 1}}
    deleted_at = c.timestamp(T0)
    stale = [dataclasses.replace(p, terminating=True, deletion_timestamp=deleted_at) for p in workers(ctx, attempt=0)]
    _, plan = step(body, ctx, stale, T0 + timedelta(seconds=10))
    assert plan.force_delete == []
    assert plan.requeue_after is not None
    assert 10 < plan.requeue_after <= reconcile.FORCE_DELETE_AFTER_SECONDS + 1
    _, plan = step(body, ctx, stale, T0 + timedelta(seconds=reconcile.FORCE_DELETE_AFTER_SECONDS + 5))
    assert plan.force_delete == ["r1-worker-0", "r1-worker-1"]


def test_pod_view_records_owner_and_deletion() -> None:
    _, ctx = admitted(h.run())
    obj = builders.worker_pod(ctx, 0, 0)
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    view = PodView.from_pod(obj)
    assert view is not None
    assert view.owner_uid == "uid-r1"
    assert view.deletion_timestamp == "2026-01-01T12:00:00Z"


def test_pods_of_another_owner_are_not_adopted() -> None:
    """A pod with our labels and name but another controller (a deleted run of the same name)."""
    body, ctx = admitted(h.run())
    foreign = [dataclasses.replace(p, owner_uid="uid-old") for p in workers(ctx)]
    _, plan = step(body, ctx, foreign)
    assert plan.status["workers"]["ready"] == 0
    assert plan.create_workers == []  # the names are taken: wait, don't 409 into "success"
    wr = cond(plan.status, "WorkersReady")
    assert wr["reason"] == "NameConflict"
    assert "uid-old" in wr["message"]
    orphan = dataclasses.replace(workers(ctx)[0], owner_uid=None)
    assert step(body, ctx, [orphan])[1].create_workers == [1]
    _, plan = step(body, ctx, [foreign[0], workers(ctx)[1]])
    assert plan.create_workers == []
    assert plan.status["workers"]["ready"] == 1


def test_clean_pod_policy_from_the_raw_spec() -> None:
    assert reconcile.clean_pod_policy({"runPolicy": {"cleanPodPolicy": "All"}}).value == "All"
    assert reconcile.clean_pod_policy({}).value == "Running"
    assert reconcile.clean_pod_policy({"runPolicy": {"cleanPodPolicy": "bogus"}}).value == "Running"


# -- root cause: a worker's failure wins over the launcher's echo of it ------------------------------------------
def _failed_launcher(ctx: builders.RunContext, finished: datetime | None) -> PodView:
    term = {
        "exitCode": 1,
        "reason": "Error",
        "message": '{"error":"mpirun noticed that process rank 1 exited","exitCode":1}',
    }
    if finished is not None:
        term["finishedAt"] = finished.strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod(
        builders.launcher_pod(ctx, 0),
        phase="Failed",
        ready=False,
        containerStatuses=[{"name": "launcher", "state": {"terminated": term}}],
    )


OOM_TEXT = "OOMKilled: the kernel killed 1 process(es) in worker r1-worker-1 for exceeding its memory limit of 256 MiB"


@pytest.mark.parametrize(
    ("worker1", "launcher_finished", "now", "expected"),
    [
        # the worker reported first, or together with the launcher: its cause, at once
        ("oom", T0, T0, ("OOMKilled", None)),
        ("oom", None, T0, ("OOMKilled", None)),
        # the launcher failed first while every worker still runs: hold for the grace, then blame it
        ("running", T0, T0 + timedelta(seconds=2), (None, 8.0)),
        ("running", T0, T0 + timedelta(seconds=10), ("LauncherFailed", None)),
        ("running", None, T0, ("LauncherFailed", None)),  # no finish time reported: decide now
        # a worker's runtime reason says Error but its own message says OOMKilled (the container survived)
        ("oom-message", T0, T0, ("OOMKilled", None)),
    ],
)
def test_worker_cause_wins_over_the_launcher(
    worker1: str, launcher_finished: datetime | None, now: datetime, expected: tuple[str | None, float | None]
) -> None:
    body, ctx = admitted(h.run(workers=2, runPolicy={"maxRestarts": 0}))
    w0, w1 = workers(ctx)
    if worker1 == "oom":
        w1 = terminated(builders.worker_pod(ctx, 1, 0), 137, reason="OOMKilled")
    elif worker1 == "oom-message":
        w1 = terminated(builders.worker_pod(ctx, 1, 0), 137, message=OOM_TEXT)
    _, plan = step(body, ctx, [w0, w1, _failed_launcher(ctx, launcher_finished)], now=now)
    reason, hold = expected
    if reason is None:
        assert plan.status.get("phase") != "Failed"
        assert plan.requeue_after == pytest.approx(hold)
        return
    assert plan.status["phase"] == "Failed"
    assert cond(plan.status, "Failed")["reason"] == reason
    if reason == "OOMKilled":
        assert "r1-worker-1" in plan.status["message"]
    if worker1 == "oom-message":
        assert "256 MiB" in plan.status["message"]


def test_lost_worker_wins_over_the_launcher_that_lost_it() -> None:
    """A worker gone with its node takes mpirun down ("ORTE has lost communication"): the worker is named."""
    body, ctx = admitted(h.run(workers=2, runPolicy={"maxRestarts": 0}))
    w0, w1 = workers(ctx)
    w1 = dataclasses.replace(w1, terminating=True, deletion_timestamp="2026-01-01T12:00:00Z")
    _, plan = step(body, ctx, [w0, w1, _failed_launcher(ctx, T0)])
    assert cond(plan.status, "Failed")["reason"] == "WorkerLost"
    assert "r1-worker-1" in plan.status["message"]
    _, plan = step(body, ctx, [w0, _failed_launcher(ctx, T0)])  # already gone from the API
    assert cond(plan.status, "Failed")["reason"] == "WorkerLost"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mpirun noticed that process rank 1 with PID 0 on node w-1 exited on signal 9 (Killed).", True),
        ("mpirun was killed by signal 9", True),
        ("exited on signal 11 (Segmentation fault)", False),
        ("exited on signal 90", False),
    ],
)
def test_signal_9_reads_as_likely_out_of_memory(text: str, expected: bool) -> None:
    body, ctx = admitted(h.run(workers=1, runPolicy={"maxRestarts": 0}))
    launcher = terminated(builders.launcher_pod(ctx, 0), 137, json.dumps({"error": text, "exitCode": 137}))
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert ("killed (signal 9, likely out of memory)" in plan.status["message"]) is expected, plan.status["message"]


def test_input_error_fails_at_once_without_restarts() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 3}))
    refused = '{"error":"mpirun exited with 2; cause: error: training.batchSize: must be >= 1","exitCode":2}'
    launcher = terminated(builders.launcher_pod(ctx, 0), 2, refused)
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert plan.status["phase"] == "Failed"
    assert plan.status["restarts"] == 0
    assert cond(plan.status, "Failed")["reason"] == "InvalidInput"
    assert "training.batchSize" in plan.status["message"]
    # any other exit code is a crash worth a restart
    launcher = terminated(builders.launcher_pod(ctx, 0), 1, '{"error":"boom","exitCode":1}')
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert plan.status["phase"] == "Pending"
    assert plan.status["restarts"] == 1


def test_gang_restart_deletes_only_own_pods_by_uid() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 1}))
    mine = [dataclasses.replace(w, uid=f"uid-{w.rank}", owner_uid=ctx.uid) for w in workers(ctx)]
    foreign = dataclasses.replace(mine[0], name="r1-launcher", role="launcher", rank=None, uid="x", owner_uid="other")
    oom = dataclasses.replace(mine[1], phase="Failed", exit_code=137, term_reason="OOMKilled")
    body = {**body, "metadata": {**body["metadata"], "uid": ctx.uid}}
    _, plan = step(body, ctx, [mine[0], oom, foreign])
    assert plan.delete_stale == {"r1-worker-0": "uid-0", "r1-worker-1": "uid-1"}


# -- kstatus, text from pods, refused writes ----------------------------------------------------------------------
def _with(phase: str, **conds: tuple[str, str]) -> dict[str, Any]:
    conditions: list[c.Condition] = []
    for type_, (status, reason) in conds.items():
        conditions = c.set_condition(conditions, type_, status, reason, f"{reason} text", now=T0)
    return {"phase": phase, "message": f"{phase} message", "conditions": conditions, "observedGeneration": 3}


@pytest.mark.parametrize(
    ("status", "ready", "reconciling", "stalled"),
    [
        (_with("Pending"), ("False", "Pending"), ("True", "Pending"), ("False", "Pending")),
        (_with("Running"), ("False", "Running"), ("True", "Running"), ("False", "Running")),
        (
            _with("Running", Stalled=("True", "NoProgress")),
            ("False", "Running"),
            ("True", "Running"),
            ("True", "NoProgress"),
        ),
        (_with("Succeeded"), ("True", "Succeeded"), ("False", "Succeeded"), ("False", "Succeeded")),
        (
            _with("Failed", Failed=("True", "DeadlineExceeded")),
            ("False", "DeadlineExceeded"),
            ("False", "Failed"),
            ("True", "DeadlineExceeded"),
        ),
        # a NoProgress left over from Running does not outlive it
        (
            _with("Succeeded", Stalled=("True", "NoProgress")),
            ("True", "Succeeded"),
            ("False", "Succeeded"),
            ("False", "Succeeded"),
        ),
    ],
)
def test_kstatus_conditions_follow_the_phase(
    status: dict[str, Any], ready: tuple[str, str], reconciling: tuple[str, str], stalled: tuple[str, str]
) -> None:
    out = reconcile.finalize(status, T0)
    for type_, want in (("Ready", ready), ("Reconciling", reconciling), ("Stalled", stalled)):
        got = cond(out, type_)
        assert (got["status"], got["reason"]) == want, (type_, got)
        assert got["observedGeneration"] == 3
    if status["phase"] == "Failed":
        assert cond(out, "Ready")["message"] == "DeadlineExceeded text"


def test_every_planned_status_is_finalized_with_kstatus() -> None:
    body, ctx = admitted(h.run())
    out = reconcile.finalize(reconcile.plan(body, ctx, workers(ctx), T0).status, T0)
    assert {x["type"] for x in out["conditions"]} >= {"Ready", "Reconciling", "Stalled"}
    assert len(out["conditions"]) <= 16  # the CRD's maxItems


def test_control_characters_from_pods_are_stripped() -> None:
    text = "boom\x1b[2J\x1b]0;pwned\x07 done\r\n\tnext\x00\x9b"
    assert c.clean(text) == "boom[2J]0;pwned done\n\tnext"
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 0}))
    launcher = terminated(builders.launcher_pod(ctx, 0), 1, json.dumps({"error": text, "exitCode": 1}))
    out = reconcile.finalize(step(body, ctx, [*workers(ctx), launcher])[1].status, T0)
    assert "\x1b" not in out["message"]
    assert "\x1b" not in cond(out, "Failed")["message"]


def test_a_refused_status_write_becomes_a_minimal_invalid_result() -> None:
    old = {"phase": "Running", "observedGeneration": 2, "conditions": [{"type": "x"}] * 16, "restarts": 0}
    out = reconcile.unstorable_status(old, "status.result.worldSize: \x1b[31m" + "x" * 5000, T0)
    assert out["phase"] == "Failed"
    assert cond(out, "Failed")["reason"] == "InvalidResult"
    assert cond(out, "Stalled")["status"] == "True"
    assert len(out["message"]) <= reconcile.UNSTORABLE_MESSAGE_LIMIT
    assert "\x1b" not in out["message"]
    assert len(out["conditions"]) == 5  # rebuilt from scratch, not from the refused list
    assert "result" not in out
    assert "progress" not in out


def test_generation_patch_only_for_finished_runs_behind() -> None:
    def body(phase: str, observed: int) -> dict[str, Any]:
        return {"metadata": {"generation": 4}, "status": {"phase": phase, "observedGeneration": observed}}

    assert reconcile.generation_patch(body("Succeeded", 3)) == {"observedGeneration": 4}
    assert reconcile.generation_patch(body("Failed", 4)) is None
    assert reconcile.generation_patch(body("Running", 3)) is None  # its daemon writes it


def _running_body(**spec: Any) -> tuple[dict[str, Any], builders.RunContext, list[PodView]]:
    body, ctx = admitted(h.run(**spec))
    pods = [*workers(ctx), pod(builders.launcher_pod(ctx, 0))]
    body, plan = step(body, ctx, pods)
    assert plan.status["phase"] == "Running"
    return body, ctx, pods


@pytest.mark.parametrize(
    ("idle", "deadline", "stalled", "requeue"),
    [
        (None, None, False, None),  # no step seen yet (an image without metrics): never Stalled
        (30, None, False, 570.0),  # default 600 s: wake up when it would be
        (599, None, False, 1.0),
        (600, None, True, None),
        (120, 60, True, None),  # runPolicy.progressDeadlineSeconds
    ],
)
def test_no_progress_marks_a_running_run_stalled(
    idle: int | None, deadline: int | None, stalled: bool, requeue: float | None
) -> None:
    policy = {"progressDeadlineSeconds": deadline} if deadline else {}
    body, ctx, pods = _running_body(runPolicy=policy)
    if idle is not None:
        since = T0 - timedelta(seconds=idle)
        body["status"]["progress"] = {"step": 42, "stepChangedAt": c.timestamp(since)}
    _, plan = step(body, ctx, pods)
    got = cond(reconcile.finalize(plan.status, T0), "Stalled")
    assert (got["status"] == "True") is stalled
    if stalled:
        assert got["reason"] == "NoProgress"
        assert "stayed at 42" in got["message"]
        assert ("Warning", "NoProgress") in [e[:2] for e in plan.events]
        # said once: the next pass with the same state plans no second Event
        body2 = {**body, "status": reconcile.finalize(plan.status, T0)}
        _, again = step(body2, ctx, pods)
        assert ("Warning", "NoProgress") not in [e[:2] for e in again.events]
    else:
        assert plan.requeue_after == (pytest.approx(requeue) if requeue is not None else plan.requeue_after)


def test_result_records_the_image_and_the_digests_that_ran() -> None:
    body, ctx, pods = _running_body()
    digest = "docker.io/mlbench/mlbench-runner@sha256:" + "b" * 64
    ran = [dataclasses.replace(p, image_id=digest) for p in pods if p.role == "worker"]
    done = terminated(builders.launcher_pod(ctx, 0), 0, h.summary().termination_message())
    _, plan = step(body, ctx, [*ran, done])
    assert plan.status["result"]["image"] == "mlbench/mlbench-runner:test"
    assert plan.status["result"]["imageIds"] == [digest]
