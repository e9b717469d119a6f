"""The decision logic, without a cluster: admission, the state machine, failures, results, cleanup."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from mlbench_operator import conditions as c
from mlbench_operator import podview, runcontext, runpods, runtime
from mlbench_operator.podview import PodView
from mlbench_operator.run import admission, finishing, holding, lifecycle, planinput, policies, progressing, restarting
from mlbench_operator.run import status as run_status
from mlbench_operator.run.nodes import NodeState
from tests import factories
from tests.operator import helpers as h

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def admitted(body: dict[str, Any], now: datetime = T0) -> tuple[dict[str, Any], runcontext.RunContext]:
    result = admission.admit(body, h.task())
    assert not isinstance(result, admission.Rejection), result
    ctx, snapshot = result
    body = {**body, "status": admission.admitted_status(body, ctx, snapshot, now)}
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


def workers(ctx: runcontext.RunContext, attempt: int = 0, ready: bool = True) -> list[PodView]:
    return [pod(runpods.worker_pod(ctx, r, attempt), ready=ready) for r in range(ctx.spec.workers)]


def step(
    body: dict[str, Any], ctx: runcontext.RunContext, pods: list[PodView], now: datetime = T0
) -> tuple[dict[str, Any], run_status.Plan]:
    plan = policies.plan(body, ctx, pods, now)
    return {**body, "status": plan.status}, plan


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found = c.get(status["conditions"], type_)
    assert found is not None, type_
    return found


# -- admission ---------------------------------------------------------------------------------------------
def test_missing_task_is_rejected() -> None:
    result = admission.admit(h.run(), None)
    assert isinstance(result, admission.Rejection)
    assert result.reason == "TaskNotFound"
    status = admission.rejected_status(h.run(), result, T0)
    assert status["phase"] == "Failed"
    assert cond(status, "Failed")["status"] == "True"
    assert cond(status, "Failed")["reason"] == "TaskNotFound"
    assert "optest-task" in status["message"]


def test_closed_division_override_is_rejected() -> None:
    result = admission.admit(h.run(overrides={"momentum": 0.5}), h.task())
    assert isinstance(result, admission.Rejection)
    assert result.reason == "OverrideNotAllowed"
    assert "momentum" in result.message


def test_invalid_effective_config_is_rejected() -> None:
    # maxEpochs below a milestone breaks a cross-field rule of the task (open division allows it).
    task = h.task()
    task["spec"]["division"] = "open"
    result = admission.admit(h.run(overrides={"maxEpochs": 10}), task)
    assert isinstance(result, admission.Rejection)
    assert result.reason == "InvalidConfig"


def test_allowed_override_is_admitted_with_snapshot() -> None:
    body = h.run(overrides={"model": {"name": "resnet", "version": "m2", "depth": 56}})
    result = admission.admit(body, h.task())
    assert not isinstance(result, admission.Rejection)
    ctx, snapshot = result
    assert snapshot["model"]["depth"] == 20  # the task as it was
    assert ctx.config.task.model.depth == 56  # what the run trains
    status = admission.admitted_status(body, ctx, snapshot, T0)
    assert status["phase"] == "Pending"
    assert status["taskSnapshot"] == snapshot
    assert status["workers"] == {"ready": 0, "total": 2}


def test_context_uses_snapshot_not_current_task() -> None:
    body, _ = admitted(h.run())
    snap = body["status"]["taskSnapshot"]
    ctx = admission.context(body, snap)
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

    launcher = pod(runpods.launcher_pod(ctx, 0))
    later = T0 + timedelta(seconds=30)
    body, plan = step(body, ctx, [*ready, launcher], later)
    assert plan.status["phase"] == "Running"
    assert cond(plan.status, "Running")["status"] == "True"
    assert not plan.create_launcher
    # WorkersReady did not flip, so its transition time is unchanged
    assert cond(plan.status, "WorkersReady")["lastTransitionTime"] == c.timestamp(T0)
    assert ("Normal", "Running", plan.status["message"]) in plan.events

    summary = factories.summary(world_size=3)
    done = terminated(runpods.launcher_pod(ctx, 0), 0, summary.termination_message())
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
    assert st["result"]["timeToGoal"] == "20m34s"  # the Time-To-Goal column; the exact figure stays above
    assert st["progress"]["accuracy"] == f"{summary.final_accuracy:.1%}"
    assert st["result"]["worldSize"] == 3
    assert st["completionTime"] == c.timestamp(later)
    assert cond(st, "Succeeded")["status"] == "True"
    assert cond(st, "GoalReached")["status"] == "True"
    assert cond(st, "Failed")["status"] == "False"
    # cleanPodPolicy Running (default): running workers go, the launcher stays for its log
    assert plan.cleanup == ["r1-worker-0", "r1-worker-1", "r1-worker-2"]


def test_goal_not_reached_still_succeeds() -> None:
    body, ctx = admitted(h.run())
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary(goal=False).termination_message())
    _, plan = step(body, ctx, [*workers(ctx), done])
    assert plan.status["phase"] == "Succeeded"
    assert cond(plan.status, "GoalReached")["status"] == "False"
    assert cond(plan.status, "GoalReached")["reason"] == "GoalNotReached"


@pytest.mark.parametrize(
    ("message", "needle"), [("", "no termination message"), ("{not json", "not JSON"), ('{"run": "r1"}', "status")]
)
def test_malformed_result_is_invalid_result(message: str, needle: str) -> None:
    body, ctx = admitted(h.run())
    done = terminated(runpods.launcher_pod(ctx, 0), 0, message)
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
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    _, plan = step(body, ctx, [*workers(ctx), done])
    assert plan.cleanup == expected


# -- failures -------------------------------------------------------------------------------------------------
def test_worker_failure_restarts_the_gang_then_gives_up() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 1}))
    launcher = pod(runpods.launcher_pod(ctx, 0))
    oom = terminated(runpods.worker_pod(ctx, 1, 0), 137, reason="OOMKilled")
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
        runpods.launcher_pod(ctx, 1), 1, '{"error":"mpirun exited with 1; last output: boom","exitCode":1}'
    )
    body, plan = step(body, ctx, [*new, failed_launcher])
    st = plan.status
    assert st["phase"] == "Failed"
    assert cond(st, "Failed")["reason"] == "LauncherFailed"
    assert "mpirun exited with 1" in st["message"]
    assert "exit code 1" in st["message"]
    assert "maxRestarts=1" in st["message"]
    assert plan.cleanup == ["r1-worker-0", "r1-worker-1"]  # failed launcher kept for its log


def _drained(obj: dict[str, Any], reason: str = "EvictionByEvictionAPI") -> PodView:
    """A worker being removed by a drain: DisruptionTarget, then the kubelet's SIGTERM fails it (exit 143)."""
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": "Eviction API: evicting"}
    view = terminated(obj, 143, "worker was stopped by SIGTERM")
    return dataclasses.replace(view, disrupted=podview.disruption(disruption))


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (None, None),
        ({"type": "DisruptionTarget", "status": "False", "reason": "EvictionByEvictionAPI"}, None),
        (
            {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager", "message": "Taint"},
            "DeletionByTaintManager: Taint",
        ),
        ({"type": "DisruptionTarget", "status": "True"}, "DisruptionTarget: no message"),
    ],
)
def test_a_disruption_is_read_from_the_pod_condition(condition: dict[str, str] | None, expected: str | None) -> None:
    assert podview.disruption(condition) == expected


def test_disruptions_restart_the_gang_without_spending_max_restarts() -> None:
    """A drained worker (DisruptionTarget) restarts the world even with maxRestarts=0, and says so; the next
    failure of the run's own still meets maxRestarts=0 (JobSet's RestartJobSetAndIgnoreMaxRestarts)."""
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 0}))
    launcher = pod(runpods.launcher_pod(ctx, 0))
    body, plan = step(body, ctx, [workers(ctx)[0], _drained(runpods.worker_pod(ctx, 1, 0)), launcher])
    st = plan.status
    assert (st["phase"], st["restarts"], st["disruptionRestarts"]) == ("Pending", 1, 1)
    assert cond(st, "Restarted")["reason"] == "Disrupted"
    assert "not counted against maxRestarts=0" in st["message"]
    assert "worker 1 (pod r1-worker-1) was disrupted (EvictionByEvictionAPI" in st["message"]
    assert plan.events[0][:2] == ("Warning", "Restarting")

    # a second disruption in the next world: restarted again, still free
    body, plan = step(body, ctx, [])
    assert plan.create_workers == [0, 1]
    new_launcher = pod(runpods.launcher_pod(ctx, 1))
    body, plan = step(body, ctx, [_drained(runpods.worker_pod(ctx, 0, 1), "PreemptionByScheduler"), new_launcher])
    assert (plan.status["restarts"], plan.status["disruptionRestarts"]) == (2, 2)

    # the run's own failure in the third world: maxRestarts=0 counts only its own restarts, so it fails now
    body, plan = step(body, ctx, [])
    oom = terminated(runpods.worker_pod(ctx, 1, 2), 137, reason="OOMKilled")
    body, plan = step(body, ctx, [pod(runpods.worker_pod(ctx, 0, 2)), oom, pod(runpods.launcher_pod(ctx, 2))])
    assert plan.status["phase"] == "Failed"
    assert "gave up after 0 of maxRestarts=0 restarts" in plan.status["message"]


def test_evicted_worker_names_the_cause() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 0}))
    evicted = pod(
        runpods.worker_pod(ctx, 0, 0),
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
    _, plan = step(body, ctx, [workers(ctx)[0], pod(runpods.launcher_pod(ctx, 0))])
    assert plan.status["restarts"] == 1
    assert "r1-worker-1" in plan.status["message"]


def test_launcher_lost_while_running_is_a_failure() -> None:
    body, ctx = admitted(h.run(workers=1, runPolicy={"maxRestarts": 2}))
    body, plan = step(body, ctx, [*workers(ctx), pod(runpods.launcher_pod(ctx, 0))])
    assert plan.status["phase"] == "Running"
    _, plan = step(body, ctx, workers(ctx))
    assert plan.status["restarts"] == 1
    assert cond(plan.status, "Restarted")["reason"] == "LauncherLost"
    assert not plan.create_launcher


def _deleted(view: PodView, due: datetime) -> PodView:
    """``view`` being deleted (a drain, an eviction, kubectl delete pod): the kubelet's deadline ``due``."""
    return dataclasses.replace(view, terminating=True, deletion_timestamp=due.strftime("%Y-%m-%dT%H:%M:%SZ"))


@pytest.mark.parametrize(
    ("launcher_phase", "worker_lost", "due_in", "held"),
    [
        ("Running", False, 30, 30.0),  # stopping its ranks: keep the world until it is done or due
        ("Running", False, -1, None),  # its deletion is due: the kubelet kills it, decide now
        ("Failed", False, 30, None),  # it stopped: its own status says how (gang_failure)
        ("Running", True, 30, None),  # a worker is gone too: that is the cause, decide now
    ],
)
def test_a_deleted_running_launcher_keeps_its_world_while_it_stops_the_ranks(
    launcher_phase: str, worker_lost: bool, due_in: int, held: float | None
) -> None:
    """Deleting the workers at once (the gang restart for a lost launcher) cut off rank 0's interrupted
    summary on its way out through mpirun (seen once in e2e: "lost communication with a remote daemon")."""
    body, ctx = admitted(h.run(workers=2, runPolicy={"maxRestarts": 2}))
    body, plan = step(body, ctx, [*workers(ctx), pod(runpods.launcher_pod(ctx, 0))])
    assert plan.status["phase"] == "Running"
    launcher = _deleted(pod(runpods.launcher_pod(ctx, 0), phase=launcher_phase), T0 + timedelta(seconds=due_in))
    world = workers(ctx)
    if worker_lost:
        world[1] = _deleted(world[1], T0 + timedelta(seconds=30))
    _, plan = step(body, ctx, [*world, launcher])
    if held is not None:
        assert plan.requeue_after == held
        assert plan.status.get("restarts", 0) == 0
        assert not plan.delete_stale
    else:
        assert plan.status["restarts"] == 1
        assert plan.requeue_after != 30.0


def test_launcher_dns_wait_failure_is_shown() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 0}))
    obj = runpods.launcher_pod(ctx, 0)
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


def aborted(stop_reason: str) -> str:
    """The termination message of a launcher whose ranks all aborted, for ``stop_reason``."""
    summary = factories.summary().model_copy(
        update={"status": "aborted", "goal_reached": False, "stop_reason": stop_reason}
    )
    return summary.termination_message()


def test_aborted_run_fails_without_restart() -> None:
    body, ctx = admitted(h.run())
    launcher = terminated(runpods.launcher_pod(ctx, 0), 3, aborted("diverged"))
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert plan.status["phase"] == "Failed"
    assert plan.status["restarts"] == 0
    assert cond(plan.status, "Failed")["reason"] == "Aborted"
    assert "diverged" in plan.status["message"]
    assert plan.status["result"]["goalReached"] is False


def test_a_launcher_stopped_by_a_signal_restarts_the_gang() -> None:
    """A drained node or an eviction SIGTERMs the launcher, which reports the ranks' aborted summary with stop
    reason interrupted: the pod was lost, the run did not decide to stop, so it restarts."""
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 3}))
    launcher = terminated(runpods.launcher_pod(ctx, 0), 3, aborted("interrupted"))
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert plan.status["phase"] == "Pending"
    assert plan.status["restarts"] == 1
    assert cond(plan.status, "Restarted")["reason"] == "LauncherFailed"


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
            **runpods.worker_pod(ctx, 0, 0),
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
    assert lifecycle.ttl_expired(status, None, T0) is None
    assert lifecycle.ttl_expired(status, 60, T0 + timedelta(seconds=10)) == pytest.approx(50)
    left = lifecycle.ttl_expired(status, 60, T0 + timedelta(seconds=70))
    assert left is not None
    assert left < 0
    # stored before the CRD bounded it: no OverflowError on every pass, just "not yet"
    far = lifecycle.ttl_expired(status, 10**14, T0)
    assert far is not None
    assert far == pytest.approx(2**31 - 1)


def test_status_patch_only_changed_keys() -> None:
    assert runtime.status_patch({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == {"b": 3, "c": 4}


# -- review fixes ------------------------------------------------------------------------------------------------
def finished_body(body: dict[str, Any], plan: run_status.Plan) -> dict[str, Any]:
    return {**body, "status": plan.status}


def test_cleanup_is_derived_from_the_cluster_after_the_final_status() -> None:
    """A finished run whose pods were not (all) deleted yet still has its cleanup pending: re-driven
    after an operator restart, and the result is never re-planned (no LauncherLost restart)."""
    body, ctx = admitted(h.run(runPolicy={"cleanPodPolicy": "All"}))
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    pods = [*workers(ctx), done]
    body, plan = step(body, ctx, pods)
    assert plan.terminal
    assert lifecycle.cleanup_pending(body, pods) == ["r1-launcher", "r1-worker-0", "r1-worker-1"]
    # the launcher went first and the operator died: what is left is still pending, nothing else
    assert lifecycle.cleanup_pending(body, workers(ctx)) == ["r1-worker-0", "r1-worker-1"]
    gone = [dataclasses.replace(p, terminating=True) for p in workers(ctx)]
    assert lifecycle.cleanup_pending(body, gone) == []
    closing = lifecycle.cleaned_up_status(body, gone, T0)
    assert closing["workers"] == {"ready": 0, "total": 2}
    assert lifecycle.CLEANED_UP in cond(closing, "WorkersReady")["message"]
    assert closing["result"] == plan.status["result"]


def test_a_cleanup_after_the_policy_was_edited_names_the_policy_now() -> None:
    """Cleaned up under Running, then the policy edited to All (the finished launcher goes too): the message
    names All once, not Running still."""
    body, ctx = admitted(h.run(runPolicy={"cleanPodPolicy": "Running"}))
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    body, _ = step(body, ctx, [*workers(ctx), done])
    first = {**body, "status": lifecycle.cleaned_up_status(body, [done], T0)}
    message = cond(first["status"], "WorkersReady")["message"]
    assert message.endswith(f"; {lifecycle.CLEANED_UP} Running")
    edited = {**first, "spec": {**first["spec"], "runPolicy": {"cleanPodPolicy": "All"}}}
    again = cond(lifecycle.cleaned_up_status(edited, [], T0), "WorkersReady")["message"]
    assert again == message.removesuffix("Running") + "All"


def test_running_policy_deletes_an_unfinished_launcher() -> None:
    """cleanPodPolicy Running (Kubeflow's meaning): a Pending launcher after DeadlineExceeded goes too."""
    body, ctx = admitted(h.run(runPolicy={"activeDeadlineSeconds": 60}))
    pending = pod(runpods.launcher_pod(ctx, 0), phase="Pending", ready=False)
    _, plan = step(body, ctx, [*workers(ctx), pending], T0 + timedelta(seconds=61))
    assert plan.status["phase"] == "Failed"
    assert plan.cleanup == ["r1-launcher", "r1-worker-0", "r1-worker-1"]


def test_waiting_init_container_reason_is_shown() -> None:
    body, ctx = admitted(h.run())
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}}
    launcher = pod(
        runpods.launcher_pod(ctx, 0),
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
    text = factories.summary().termination_message().replace('"best_accuracy":0.81', f'"best_accuracy":{number}')
    text = text.replace('"bestAccuracy":0.81', f'"bestAccuracy":{number}')
    assert number in text
    done = terminated(runpods.launcher_pod(ctx, 0), 0, text)
    _, plan = step(body, ctx, [*workers(ctx), done])
    assert plan.status["phase"] == "Failed"
    assert cond(plan.status, "Failed")["reason"] == "InvalidResult"
    assert "result" not in plan.status
    json.dumps(plan.status, allow_nan=False)  # what the API server would accept


def test_failed_launcher_with_a_non_aborted_summary_is_not_aborted() -> None:
    """Only status=aborted means 'a restart would repeat it'; a crash after a summary restarts."""
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 1}))
    launcher = terminated(runpods.launcher_pod(ctx, 0), 1, factories.summary().termination_message())
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert plan.status["phase"] == "Pending"
    assert plan.status["restarts"] == 1
    assert cond(plan.status, "Restarted")["reason"] == "LauncherFailed"


def test_workers_ready_is_false_on_failure() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 0}))
    body, plan = step(body, ctx, [*workers(ctx), pod(runpods.launcher_pod(ctx, 0))])
    assert cond(plan.status, "WorkersReady")["status"] == "True"
    failed = terminated(runpods.launcher_pod(ctx, 0), 1, '{"error":"boom","exitCode":1}')
    body, plan = step(body, ctx, [*workers(ctx), failed])
    assert plan.status["phase"] == "Failed"
    assert (cond(plan.status, "WorkersReady")["status"], cond(plan.status, "WorkersReady")["reason"]) == (
        "False",
        "RunFailed",
    )
    gone = [dataclasses.replace(p, terminating=True) for p in workers(ctx)]
    assert lifecycle.cleaned_up_status(body, [*gone, failed], T0)["workers"] == {"ready": 0, "total": 2}


def test_refused_creates_403_keeps_retrying_with_a_condition_422_fails() -> None:
    body, ctx = admitted(h.run())
    quota = "exceeded quota: q, requested: pods=1, used: pods=10, limited: pods=10"
    plan = lifecycle.creation_failed(body, [("pod r1-worker-1", 403, quota)], T0)
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
    assert lifecycle.creation_failed(body, [("pod r1-worker-1", 403, quota)], T0).events == []

    invalid = lifecycle.creation_failed(
        body, [("pod r1-worker-0", 422, "spec.containers[0].image: Required value")], T0
    )
    assert invalid.terminal
    assert cond(invalid.status, "Failed")["reason"] == "CreateFailed"
    assert "Required value" in invalid.status["message"]


@pytest.mark.parametrize(
    ("what", "condition"),
    [
        ("pod r1-worker-1", "WorkersReady"),
        ("ConfigMap r1-config", "WorkersReady"),
        ("Secret r1-ssh", "WorkersReady"),
        ("NetworkPolicy r1", "WorkersReady"),
        ("Service r1", "Running"),  # created right before the launcher, once every worker is Ready
        ("pod r1-launcher", "Running"),
    ],
)
def test_a_refused_create_is_shown_on_the_condition_of_its_stage(what: str, condition: str) -> None:
    assert lifecycle.refusal_condition(what) == condition


def test_a_refused_service_stays_shown_while_the_workers_are_ready() -> None:
    """A services quota refuses the headless Service: the next pass (all workers Ready, no launcher yet)
    keeps CreateFailed instead of flipping WorkersReady to AllWorkersReady, and the same refusal again
    posts no second Event."""
    body, ctx = admitted(h.run())
    body, _ = step(body, ctx, workers(ctx))
    quota = "exceeded quota: q, requested: services=1, used: services=5, limited: services=5"
    plan = lifecycle.creation_failed(body, [("Service r1", 403, quota)], T0)
    assert [e[:2] for e in plan.events] == [("Warning", "CreateFailed")]
    body = finished_body(body, plan)
    body, nxt = step(body, ctx, workers(ctx))
    assert nxt.create_launcher
    assert (cond(nxt.status, "Running")["reason"], cond(nxt.status, "WorkersReady")["reason"]) == (
        "CreateFailed",
        "AllWorkersReady",
    )
    assert lifecycle.creation_failed(body, [("Service r1", 403, quota)], T0).events == []


def test_pod_stuck_terminating_on_a_lost_node_is_force_deleted() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 2}))
    body = {**body, "status": {**body["status"], "restarts": 1}}
    deleted_at = c.timestamp(T0)
    stale = [dataclasses.replace(p, terminating=True, deletion_timestamp=deleted_at) for p in workers(ctx, attempt=0)]
    _, plan = step(body, ctx, stale, T0 + timedelta(seconds=10))
    assert plan.force_delete == []
    assert plan.requeue_after is not None
    assert 10 < plan.requeue_after <= lifecycle.FORCE_DELETE_AFTER_SECONDS + 1
    _, plan = step(body, ctx, stale, T0 + timedelta(seconds=lifecycle.FORCE_DELETE_AFTER_SECONDS + 5))
    assert plan.force_delete == ["r1-worker-0", "r1-worker-1"]


def test_pod_view_records_owner_and_deletion() -> None:
    _, ctx = admitted(h.run())
    obj = runpods.worker_pod(ctx, 0, 0)
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
    assert lifecycle.clean_pod_policy({"runPolicy": {"cleanPodPolicy": "All"}}).value == "All"
    assert lifecycle.clean_pod_policy({}).value == "Running"
    assert lifecycle.clean_pod_policy({"runPolicy": {"cleanPodPolicy": "bogus"}}).value == "Running"


# -- root cause: a worker's failure wins over the launcher's echo of it ------------------------------------------
def _failed_launcher(ctx: runcontext.RunContext, finished: datetime | None) -> PodView:
    term = {
        "exitCode": 1,
        "reason": "Error",
        "message": '{"error":"mpirun noticed that process rank 1 exited","exitCode":1}',
    }
    if finished is not None:
        term["finishedAt"] = finished.strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod(
        runpods.launcher_pod(ctx, 0),
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
        w1 = terminated(runpods.worker_pod(ctx, 1, 0), 137, reason="OOMKilled")
    elif worker1 == "oom-message":
        w1 = terminated(runpods.worker_pod(ctx, 1, 0), 137, message=OOM_TEXT)
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
    launcher = terminated(runpods.launcher_pod(ctx, 0), 137, json.dumps({"error": text, "exitCode": 137}))
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert ("killed (signal 9, likely out of memory)" in plan.status["message"]) is expected, plan.status["message"]


def test_input_error_fails_at_once_without_restarts() -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 3}))
    refused = '{"error":"mpirun exited with 2; cause: error: training.batchSize: must be >= 1","exitCode":2}'
    launcher = terminated(runpods.launcher_pod(ctx, 0), 2, refused)
    _, plan = step(body, ctx, [*workers(ctx), launcher])
    assert plan.status["phase"] == "Failed"
    assert plan.status["restarts"] == 0
    assert cond(plan.status, "Failed")["reason"] == "InvalidInput"
    assert "training.batchSize" in plan.status["message"]
    # any other exit code is a crash worth a restart
    launcher = terminated(runpods.launcher_pod(ctx, 0), 1, '{"error":"boom","exitCode":1}')
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
    out = run_status.finalize(status, T0)
    for type_, want in (("Ready", ready), ("Reconciling", reconciling), ("Stalled", stalled)):
        got = cond(out, type_)
        assert (got["status"], got["reason"]) == want, (type_, got)
        assert got["observedGeneration"] == 3
    if status["phase"] == "Failed":
        assert cond(out, "Ready")["message"] == "DeadlineExceeded text"


def test_every_planned_status_is_finalized_with_kstatus() -> None:
    body, ctx = admitted(h.run())
    out = run_status.finalize(policies.plan(body, ctx, workers(ctx), T0).status, T0)
    assert {x["type"] for x in out["conditions"]} >= {"Ready", "Reconciling", "Stalled"}
    assert len(out["conditions"]) <= 16  # the CRD's maxItems


def test_control_characters_from_pods_are_stripped() -> None:
    text = "boom\x1b[2J\x1b]0;pwned\x07 done\r\n\tnext\x00\x9b"
    assert c.clean(text) == "boom[2J]0;pwned done\n\tnext"
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 0}))
    launcher = terminated(runpods.launcher_pod(ctx, 0), 1, json.dumps({"error": text, "exitCode": 1}))
    out = run_status.finalize(step(body, ctx, [*workers(ctx), launcher])[1].status, T0)
    assert "\x1b" not in out["message"]
    assert "\x1b" not in cond(out, "Failed")["message"]


def test_a_refused_status_write_becomes_a_minimal_invalid_result() -> None:
    old = {"phase": "Running", "observedGeneration": 2, "conditions": [{"type": "x"}] * 16, "restarts": 0}
    out = run_status.unstorable_status(old, "status.result.worldSize: \x1b[31m" + "x" * 5000, T0)
    assert out["phase"] == "Failed"
    assert cond(out, "Failed")["reason"] == "InvalidResult"
    assert cond(out, "Stalled")["status"] == "True"
    assert len(out["message"]) <= run_status.UNSTORABLE_MESSAGE_LIMIT
    assert "\x1b" not in out["message"]
    assert len(out["conditions"]) == 5  # rebuilt from scratch, not from the refused list
    assert "result" not in out
    assert "progress" not in out


def test_generation_patch_only_for_finished_runs_behind() -> None:
    def body(phase: str, observed: int) -> dict[str, Any]:
        return {"metadata": {"generation": 4}, "status": {"phase": phase, "observedGeneration": observed}}

    assert run_status.generation_patch(body("Succeeded", 3)) == {"observedGeneration": 4}
    assert run_status.generation_patch(body("Failed", 4)) is None
    assert run_status.generation_patch(body("Running", 3)) is None  # its daemon writes it


def _running_body(**spec: Any) -> tuple[dict[str, Any], runcontext.RunContext, list[PodView]]:
    body, ctx = admitted(h.run(**spec))
    pods = [*workers(ctx), pod(runpods.launcher_pod(ctx, 0))]
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
    got = cond(run_status.finalize(plan.status, T0), "Stalled")
    assert (got["status"] == "True") is stalled
    if stalled:
        assert got["reason"] == "NoProgress"
        assert "stayed at 42" in got["message"]
        assert ("Warning", "NoProgress") in [e[:2] for e in plan.events]
        # said once: the next pass with the same state plans no second Event
        body2 = {**body, "status": run_status.finalize(plan.status, T0)}
        _, again = step(body2, ctx, pods)
        assert ("Warning", "NoProgress") not in [e[:2] for e in again.events]
    else:
        assert plan.requeue_after == (pytest.approx(requeue) if requeue is not None else plan.requeue_after)


def _w(rank: int, attempt: int = 1, owner: str = "u1", **kw: Any) -> PodView:
    return PodView(name=f"r1-worker-{rank}", role="worker", rank=rank, attempt=attempt, owner_uid=owner, **kw)


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([_w(0, ip="10.0.0.9")], "10.0.0.9"),
        ([_w(1, ip="10.0.0.1"), _w(0, ip="10.0.0.9")], "10.0.0.9"),
        ([_w(0, owner="old-run", ip="10.0.0.7")], None),  # a deleted run of the same name: not ours
        ([_w(0, attempt=0, ip="10.0.0.8")], None),  # the failed attempt's rank 0
        ([_w(0, attempt=0, ip="10.0.0.8"), _w(0, ip="10.0.0.9")], "10.0.0.9"),
        ([_w(0, ip="10.0.0.9", terminating=True)], None),
        ([_w(0)], None),  # no IP yet
    ],
)
def test_rank0_is_the_current_attempts_own(pods: list[PodView], expected: str | None) -> None:
    found = lifecycle.rank0(pods, "u1", 1)
    assert (found.ip if found is not None else None) == expected


def test_a_gang_restart_clears_the_failed_attempts_progress() -> None:
    """The new attempt is not Stalled at once by the old attempt's stepChangedAt (nor shows its epoch)."""
    body, ctx, pods = _running_body(runPolicy={"progressDeadlineSeconds": 60})
    since = T0 - timedelta(seconds=30)
    body["status"]["progress"] = {"epoch": 3.5, "step": 42, "stepChangedAt": c.timestamp(since)}
    failed = terminated(runpods.worker_pod(ctx, 1, 0), 1)
    body, plan = step(body, ctx, [p for p in pods if p.name != "r1-worker-1"] + [failed])
    assert plan.status["restarts"] == 1
    assert "progress" in plan.status
    assert plan.status["progress"] is None  # a merge patch's null: deleted
    status = run_status.finalize(plan.status, T0)
    assert status["progress"] is None
    body = {**body, "status": {k: v for k, v in status.items() if v is not None}}
    # the new attempt runs 10 minutes later, before any scrape of its rank 0
    later = T0 + timedelta(minutes=10)
    launcher = pod(runpods.launcher_pod(ctx, 1))
    _, plan = step(body, ctx, [*workers(ctx, attempt=1), launcher], later)
    assert plan.status["phase"] == "Running"
    assert cond(run_status.finalize(plan.status, later), "Stalled")["status"] == "False"
    assert ("Warning", "NoProgress") not in [e[:2] for e in plan.events]


def test_result_records_the_image_and_the_digests_that_ran() -> None:
    body, ctx, pods = _running_body()
    digest = "localhost/mlbench/mlbench-runner@sha256:" + "b" * 64
    ran = [dataclasses.replace(p, image_id=digest) for p in pods if p.role == "worker"]
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    _, plan = step(body, ctx, [*ran, done])
    assert plan.status["result"]["image"] == "localhost/mlbench/mlbench-runner:test"
    assert plan.status["result"]["imageIds"] == [digest]


# -- plan's policies, one table each (policies.POLICIES) -------------------------------------------------------
#: Builds a world from the run's context: the pods the policy sees.
World = Callable[[runcontext.RunContext], list[PodView]]
#: Builds one pod from the run's context.
Pod = Callable[[runcontext.RunContext], PodView]


def decide(
    policy: planinput.Policy,
    world: World,
    *,
    run_policy: dict[str, Any] | None = None,
    restarts: int = 0,
    conditions: dict[str, tuple[str, str]] | None = None,
    now: datetime = T0,
    nodes: dict[str, NodeState] | None = None,
) -> tuple[run_status.Plan | None, planinput.PlanInput]:
    """One policy on its own, over an admitted 2-worker run with ``restarts`` and the given old conditions."""
    body, ctx = admitted(h.run(runPolicy=run_policy) if run_policy else h.run())
    status = {**body["status"], "restarts": restarts}
    for type_, (value, reason) in (conditions or {}).items():
        status["conditions"] = c.set_condition(status["conditions"], type_, value, reason, f"{reason} before", now=T0)
    inp = planinput.PlanInput.of({**body, "status": status}, ctx, world(ctx), now, nodes=nodes)
    return policy(inp), inp


def outcome(plan: run_status.Plan | None) -> tuple[str, str] | None:
    """(phase, the reason that tells why): Failed's reason once failed, Succeeded's once succeeded, else
    Restarted's ("" when there was no restart)."""
    if plan is None:
        return None
    st = plan.status
    phase = st.get("phase", "")
    if phase == "Failed":
        return phase, cond(st, "Failed")["reason"]
    if phase == "Succeeded":
        return phase, cond(st, "Succeeded")["reason"]
    restarted = c.get(st["conditions"], "Restarted")
    return phase, restarted["reason"] if restarted else ""


def launcher_done(code: int, message: str) -> World:
    return lambda ctx: [*workers(ctx), terminated(runpods.launcher_pod(ctx, 0), code, message)]


def running(ctx: runcontext.RunContext) -> list[PodView]:
    return [*workers(ctx), pod(runpods.launcher_pod(ctx, 0))]


def worker(rank: int, **changes: Any) -> Pod:
    """Worker ``rank`` of attempt 0, Running and Ready unless ``changes`` say otherwise."""
    return lambda ctx: dataclasses.replace(workers(ctx)[rank], **changes)


def foreign(make: Pod) -> Pod:
    """The same pod, but controlled by another owner (e.g. a deleted run of the same name)."""
    return lambda ctx: dataclasses.replace(make(ctx), owner_uid="uid-old")


def launcher_failed_at(seconds: float | None, *others: Pod) -> World:
    """The launcher failed at T0 + ``seconds`` (None: no finish time reported), besides ``others``."""

    def world(ctx: runcontext.RunContext) -> list[PodView]:
        done = None if seconds is None else T0 + timedelta(seconds=seconds)
        return [*(make(ctx) for make in others), _failed_launcher(ctx, done)]

    return world


def oom_worker(ctx: runcontext.RunContext) -> list[PodView]:
    """Worker 1 OOM-killed while the launcher still runs."""
    return [workers(ctx)[0], terminated(runpods.worker_pod(ctx, 1, 0), 137, reason="OOMKilled"), running(ctx)[2]]


def of_attempt(world: World, attempt: int) -> World:
    """The same world as pods of ``attempt``."""
    return lambda ctx: [dataclasses.replace(p, attempt=attempt) for p in world(ctx)]


SUMMARY = factories.summary().termination_message()
NO_GOAL = factories.summary(goal=False).termination_message()
ABORTED = aborted("diverged")
INTERRUPTED = aborted("interrupted")
CRASH = '{"error":"mpirun exited with 1","exitCode":1}'
UNSCHEDULABLE = {"phase": "Pending", "ready": False, "scheduled": False, "unschedulable": "0/4 nodes are available"}


def test_the_policies_and_their_order() -> None:
    assert [p.__name__ for p in policies.POLICIES] == [
        "launcher_succeeded",
        "launcher_aborted",
        "deadline_exceeded",
        "root_cause_hold",
        "launcher_stopping_hold",
        "gang_failure",
        "stale_attempt",
        "startup_deadline",
        "startup_backoff",
        "make_progress",
    ]


@pytest.mark.parametrize(
    ("world", "expected"),
    [
        pytest.param(workers, None, id="no-launcher"),
        pytest.param(running, None, id="launcher-running"),
        pytest.param(launcher_done(1, SUMMARY), None, id="launcher-failed"),
        pytest.param(launcher_done(0, SUMMARY), ("Succeeded", "GoalReached"), id="goal-reached"),
        pytest.param(launcher_done(0, NO_GOAL), ("Succeeded", "GoalNotReached"), id="goal-not-reached"),
        pytest.param(launcher_done(0, ABORTED), ("Succeeded", "Aborted"), id="aborted-but-exit-0"),
        pytest.param(launcher_done(0, ""), ("Failed", "InvalidResult"), id="no-message"),
        pytest.param(launcher_done(0, "{not json"), ("Failed", "InvalidResult"), id="not-json"),
    ],
)
def test_policy_launcher_succeeded(world: World, expected: tuple[str, str] | None) -> None:
    plan, _ = decide(finishing.launcher_succeeded, world)
    assert outcome(plan) == expected
    if plan is None or expected is None:
        return
    assert plan.terminal
    assert plan.cleanup == ["r1-worker-0", "r1-worker-1"]  # cleanPodPolicy Running: the launcher stays for its log
    assert plan.events == [("Normal" if expected[0] == "Succeeded" else "Warning", expected[0], plan.status["message"])]
    assert ("result" in plan.status) is (expected[0] == "Succeeded")


@pytest.mark.parametrize(
    ("world", "expected"),
    [
        pytest.param(workers, None, id="no-launcher"),
        pytest.param(running, None, id="launcher-running"),
        pytest.param(launcher_done(0, ABORTED), None, id="exit-0-is-launcher_succeeded"),
        pytest.param(launcher_done(1, ""), None, id="no-message"),
        pytest.param(launcher_done(1, CRASH), None, id="an-error-is-a-crash"),
        pytest.param(launcher_done(1, SUMMARY), None, id="a-non-aborted-summary-is-a-crash"),
        pytest.param(launcher_done(3, ABORTED), ("Failed", "Aborted"), id="aborted"),
        pytest.param(launcher_done(3, INTERRUPTED), None, id="a-stopped-launcher-is-a-lost-pod"),
    ],
)
def test_policy_launcher_aborted(world: World, expected: tuple[str, str] | None) -> None:
    plan, _ = decide(finishing.launcher_aborted, world)
    assert outcome(plan) == expected
    if plan is None:
        return
    assert plan.status["result"]["goalReached"] is False  # the figures are kept
    assert cond(plan.status, "GoalReached")["reason"] == "Aborted"
    assert "exit code 3" in plan.status["message"]
    assert plan.status["restarts"] == 0


@pytest.mark.parametrize(
    ("deadline", "elapsed", "expected"),
    [
        (None, 10**6, None),
        (60, 30, None),
        (60, 59.5, None),
        (60, 60, ("Failed", "DeadlineExceeded")),
        (60, 61, ("Failed", "DeadlineExceeded")),
    ],
)
def test_policy_deadline_exceeded(deadline: int | None, elapsed: float, expected: tuple[str, str] | None) -> None:
    policy = {"activeDeadlineSeconds": deadline} if deadline else None
    plan, _ = decide(finishing.deadline_exceeded, running, run_policy=policy, now=T0 + timedelta(seconds=elapsed))
    assert outcome(plan) == expected
    if plan is not None:
        assert "activeDeadlineSeconds=60" in plan.status["message"]
        assert plan.cleanup == ["r1-launcher", "r1-worker-0", "r1-worker-1"]  # nothing had finished


@pytest.mark.parametrize(
    ("world", "expected"),
    [
        pytest.param(running, None, id="launcher-running"),
        pytest.param(launcher_failed_at(-2, worker(0), worker(1)), 8.0, id="workers-running:hold"),
        pytest.param(launcher_failed_at(-10, worker(0), worker(1)), None, id="grace-over"),
        pytest.param(launcher_failed_at(None, worker(0), worker(1)), None, id="no-finish-time"),
        pytest.param(launcher_failed_at(-2, worker(0), worker(1, phase="Failed")), None, id="a-worker-failed"),
        pytest.param(launcher_failed_at(-2, worker(0), worker(1, terminating=True)), None, id="a-worker-lost"),
        pytest.param(launcher_failed_at(-2, worker(0)), None, id="a-worker-gone"),
        pytest.param(
            launcher_failed_at(-2, worker(0, phase="Pending"), worker(1, phase="Pending")), None, id="none-running"
        ),
    ],
)
def test_policy_root_cause_hold(world: World, expected: float | None) -> None:
    plan, _ = decide(holding.root_cause_hold, world)
    if expected is None:
        assert plan is None
        return
    assert plan is not None
    assert plan.requeue_after == pytest.approx(expected)
    assert plan.status["phase"] == "Pending"  # nothing decided: the phase stays
    assert (plan.events, plan.create_workers, plan.delete_stale) == ([], [], {})


#: Worker 1's node stopped answering; its Lease is late, not yet lost; every node answers.
SILENT = {"node-b": NodeState(silent="its kubelet last renewed its Lease 31 s ago")}
SUSPECT = {"node-b": NodeState(wait=5.0)}
ANSWER = {"node-a": NodeState(), "node-b": NodeState()}
ON_NODES = (worker(0, node="node-a"), worker(1, node="node-b"))


@pytest.mark.parametrize(
    ("world", "nodes", "expected"),
    [
        pytest.param(launcher_failed_at(-2, *ON_NODES), ANSWER, 8.0, id="nodes-answer:root-cause-grace"),
        pytest.param(launcher_failed_at(-2, *ON_NODES), SILENT, None, id="node-silent:decide-now"),
        pytest.param(launcher_failed_at(-9, *ON_NODES), SUSPECT, 5.0, id="lease-late:wait-longer-than-the-grace"),
        pytest.param(launcher_failed_at(-30, *ON_NODES), SUSPECT, 5.0, id="lease-late:after-the-grace"),
        pytest.param(launcher_failed_at(-30, *ON_NODES), ANSWER, None, id="grace-over-nodes-answer"),
    ],
)
def test_policy_root_cause_hold_waits_for_a_late_node(
    world: World, nodes: dict[str, NodeState], expected: float | None
) -> None:
    plan, _ = decide(holding.root_cause_hold, world, nodes=nodes)
    assert (plan.requeue_after if plan is not None else None) == (pytest.approx(expected) if expected else None)


@pytest.mark.parametrize(
    ("nodes", "expected", "counted"),
    [
        pytest.param(SILENT, ("Pending", "Disrupted"), 0, id="node-silent:a-disruption"),
        pytest.param(ANSWER, ("Pending", "LauncherFailed"), 1, id="nodes-answer:the-runs-failure"),
    ],
)
def test_a_launcher_failure_on_a_silent_node_is_a_disruption(
    nodes: dict[str, NodeState], expected: tuple[str, str], counted: int
) -> None:
    """mpirun fails when a node is lost, before the node lifecycle controller marks it NotReady: what the node's
    Lease says decides whether the restart spends maxRestarts."""
    plan, _ = decide(restarting.gang_failure, launcher_failed_at(-30, *ON_NODES), nodes=nodes)
    assert outcome(plan) == expected
    assert plan is not None
    st = plan.status
    assert st["restarts"] - (st.get("disruptionRestarts") or 0) == counted
    if counted == 0:
        assert "worker 1 (pod r1-worker-1) is on node node-b, which stopped answering" in st["message"]


@pytest.mark.parametrize(
    ("world", "restarts", "was_running", "expected"),
    [
        pytest.param(running, 0, True, None, id="healthy"),
        pytest.param(workers, 0, False, None, id="no-launcher-yet"),
        pytest.param(oom_worker, 0, True, ("Pending", "OOMKilled"), id="worker-failed:restart"),
        pytest.param(of_attempt(oom_worker, 1), 1, True, ("Failed", "OOMKilled"), id="worker-failed:gave-up"),
        pytest.param(launcher_done(1, CRASH), 0, True, ("Pending", "LauncherFailed"), id="launcher-failed"),
        pytest.param(
            launcher_done(2, '{"error":"bad config","exitCode":2}'),
            0,
            True,
            ("Failed", "InvalidInput"),
            id="input-error:permanent",
        ),
        pytest.param(
            lambda ctx: [workers(ctx)[0], running(ctx)[2]], 0, True, ("Pending", "WorkerLost"), id="worker-lost"
        ),
        pytest.param(workers, 0, True, ("Pending", "LauncherLost"), id="launcher-lost"),
        pytest.param(
            lambda ctx: [workers(ctx)[0], terminated(runpods.worker_pod(ctx, 1, 0), 0)],
            0,
            False,
            ("Pending", "WorkerExited"),
            id="worker-exited",
        ),
        pytest.param(
            lambda ctx: [*oom_worker(ctx), *workers(ctx, attempt=1)], 1, True, None, id="stale-pods-are-history"
        ),
    ],
)
def test_policy_gang_failure(world: World, restarts: int, was_running: bool, expected: tuple[str, str] | None) -> None:
    conditions = {"Running": ("True", "LauncherRunning")} if was_running else None
    plan, inp = decide(
        restarting.gang_failure, world, run_policy={"maxRestarts": 1}, restarts=restarts, conditions=conditions
    )
    assert outcome(plan) == expected
    if plan is None or expected is None:
        return
    if plan.terminal:
        assert plan.status["restarts"] == restarts
        assert plan.delete_stale == {}
        return
    assert plan.status["restarts"] == restarts + 1
    assert plan.status["workers"]["ready"] == 0
    assert set(plan.delete_stale) == {p.name for p in inp.own if not p.terminating}
    assert plan.events == [("Warning", "Restarting", plan.status["message"])]
    # a failed launcher's log is kept before the restart deletes it
    assert (plan.keep_log_of == "r1-launcher") is (expected[1] == "LauncherFailed")


@pytest.mark.parametrize(
    ("world", "restarts", "deleted", "waiting_for"),
    [
        pytest.param(running, 0, None, 0, id="current-attempt-only"),
        pytest.param(workers, 1, {"r1-worker-0": "", "r1-worker-1": ""}, 2, id="old-workers"),
        pytest.param(
            lambda ctx: [worker(0, terminating=True)(ctx), worker(1, terminating=True)(ctx), running(ctx)[2]],
            1,
            {"r1-launcher": ""},
            3,
            id="terminating-ones-are-not-deleted-again",
        ),
    ],
)
def test_policy_stale_attempt(world: World, restarts: int, deleted: dict[str, str] | None, waiting_for: int) -> None:
    plan, _ = decide(restarting.stale_attempt, world, restarts=restarts)
    if deleted is None:
        assert plan is None
        return
    assert plan is not None
    assert plan.delete_stale == deleted
    assert plan.status["phase"] == "Pending"
    assert plan.status["message"] == f"waiting for {waiting_for} pods of the previous attempt to terminate"
    assert cond(plan.status, "WorkersReady")["reason"] == "Restarting"
    assert (plan.create_workers, plan.create_launcher) == ([], False)


@pytest.mark.parametrize(
    ("world", "conditions", "expected"),
    [
        pytest.param(
            lambda ctx: [], None, ("Pending", "WaitingForWorkers", "WaitingForWorkers", [0, 1], False), id="empty"
        ),
        pytest.param(
            lambda ctx: workers(ctx, ready=False),
            None,
            ("Starting", "WaitingForWorkers", "WaitingForWorkers", [], False),
            id="scheduled-not-ready",
        ),
        pytest.param(
            lambda ctx: [workers(ctx)[0]],
            {"WorkersReady": ("False", "CreateFailed")},
            ("Pending", "CreateFailed", "WaitingForWorkers", [1], False),
            id="create-refused-before",
        ),
        pytest.param(
            lambda ctx: [workers(ctx)[0], foreign(worker(1))(ctx)],
            None,
            ("Pending", "NameConflict", "WaitingForWorkers", [], False),
            id="worker-name-held",
        ),
        pytest.param(
            lambda ctx: [workers(ctx)[0], worker(1, **UNSCHEDULABLE)(ctx)],
            None,
            ("Pending", "Unschedulable", "WaitingForWorkers", [], False),
            id="unschedulable",
        ),
        pytest.param(
            lambda ctx: [workers(ctx)[0], worker(1, ready=False, waiting="ImagePullBackOff: x")(ctx)],
            None,
            ("Starting", "ContainerWaiting", "WaitingForWorkers", [], False),
            id="container-waiting",
        ),
        pytest.param(
            workers, None, ("Starting", "AllWorkersReady", "CreatingLauncher", [], True), id="all-ready:create-launcher"
        ),
        pytest.param(
            workers,
            {"Running": ("False", "CreateFailed")},
            ("Starting", "AllWorkersReady", "CreateFailed", [], True),
            id="launcher-create-refused-before",
        ),
        pytest.param(
            lambda ctx: [*workers(ctx), foreign(lambda ctx: running(ctx)[2])(ctx)],
            None,
            ("Starting", "AllWorkersReady", "NameConflict", [], False),
            id="launcher-name-held",
        ),
        pytest.param(
            lambda ctx: [*workers(ctx), pod(runpods.launcher_pod(ctx, 0), phase="Pending", ready=False)],
            None,
            ("Starting", "AllWorkersReady", "LauncherStarting", [], False),
            id="launcher-pending",
        ),
        pytest.param(running, None, ("Running", "AllWorkersReady", "LauncherRunning", [], False), id="running"),
    ],
)
def test_policy_make_progress(
    world: World, conditions: dict[str, tuple[str, str]] | None, expected: tuple[str, str, str, list[int], bool]
) -> None:
    plan, _ = decide(progressing.make_progress, world, conditions=conditions)
    assert plan is not None
    wr, run = cond(plan.status, "WorkersReady"), cond(plan.status, "Running")
    assert (plan.status["phase"], wr["reason"], run["reason"], plan.create_workers, plan.create_launcher) == expected
    assert plan.status["message"] == f"{wr['message']}; {run['message']}"
    assert cond(plan.status, "Succeeded")["reason"] == "InProgress"
    # an Event when the phase changes (the admitted run was Pending), none otherwise
    assert (("Normal", expected[0]) in [e[:2] for e in plan.events]) is (expected[0] != "Pending")


@pytest.mark.parametrize(
    ("world", "elapsed", "expected"),
    [
        # a result beats the deadline: the run did finish
        pytest.param(launcher_done(0, SUMMARY), 61, ("Succeeded", "GoalReached"), id="result-beats-deadline"),
        pytest.param(launcher_done(3, ABORTED), 61, ("Failed", "Aborted"), id="aborted-beats-deadline"),
        # the deadline beats a failure: no restart past it
        pytest.param(oom_worker, 61, ("Failed", "DeadlineExceeded"), id="deadline-beats-restart"),
        pytest.param(oom_worker, 30, ("Pending", "OOMKilled"), id="restart-before-deadline"),
        # a worker's cause beats the launcher's echo of it; the launcher alone is held for the grace first
        pytest.param(
            launcher_failed_at(28, worker(0), lambda ctx: terminated(runpods.worker_pod(ctx, 1, 0), 137)),
            30,
            ("Pending", "WorkerFailed"),
            id="worker-beats-launcher",
        ),
        pytest.param(launcher_failed_at(28, worker(0), worker(1)), 30, ("Pending", ""), id="launcher-held"),
        pytest.param(launcher_failed_at(10, worker(0), worker(1)), 30, ("Pending", "LauncherFailed"), id="then-blamed"),
    ],
)
def test_plan_precedence(world: World, elapsed: float, expected: tuple[str, str]) -> None:
    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 1, "activeDeadlineSeconds": 60}))
    _, plan = step(body, ctx, world(ctx), T0 + timedelta(seconds=elapsed))
    assert outcome(plan) == expected


def test_plan_input_sorts_the_pods_once() -> None:
    body, ctx = admitted(h.run())
    body = {**body, "status": {**body["status"], "restarts": 1}}
    old = workers(ctx, attempt=0)
    new = workers(ctx, attempt=1)
    beyond = dataclasses.replace(new[1], name="r1-worker-2", rank=2)
    launcher = pod(runpods.launcher_pod(ctx, 1))
    other = dataclasses.replace(new[0], name="r1-worker-9", rank=9, owner_uid="someone-else")
    inp = planinput.PlanInput.of(body, ctx, [*old, *new, beyond, launcher, other], T0)
    assert inp.restarts == 1
    assert [p.name for p in inp.stale] == ["r1-worker-0", "r1-worker-1"]
    assert {p.attempt for p in inp.current} == {1}
    assert inp.foreign == (other,)
    assert sorted(inp.workers) == [0, 1]  # rank 2 is beyond spec.workers
    assert inp.launcher == launcher
    assert (inp.ready, inp.total) == (2, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inp.restarts = 2  # type: ignore[misc]


def test_every_pass_force_deletes_and_wakes_up_whatever_decides() -> None:
    """Force-deletes and the earliest wake-up are added to the plan of whichever policy decided."""
    body, ctx = admitted(h.run(runPolicy={"activeDeadlineSeconds": 100}))
    stuck = dataclasses.replace(workers(ctx)[1], terminating=True, deletion_timestamp=c.timestamp(T0))
    later = c.timestamp(T0 + timedelta(seconds=50))
    leaving = dataclasses.replace(stuck, name="r1-worker-7", rank=7, deletion_timestamp=later)
    now = T0 + timedelta(seconds=lifecycle.FORCE_DELETE_AFTER_SECONDS + 10)
    _, plan = step(body, ctx, [workers(ctx)[0], stuck, leaving, pod(runpods.launcher_pod(ctx, 0))], now)
    assert cond(plan.status, "Restarted")["reason"] == "WorkerLost"  # gang_failure decided
    assert plan.force_delete == ["r1-worker-1"]
    # the leaving pod would count as stuck at 50 + 60 + 1 s, the deadline is at 100 s: the earlier wins
    assert plan.requeue_after == pytest.approx(100 - (lifecycle.FORCE_DELETE_AFTER_SECONDS + 10))


@pytest.mark.parametrize(
    ("status", "serves"),
    [
        ({}, None),  # not admitted: unknown
        ({"taskSnapshot": {"runner": {"image": "mlbench/runner:1"}}}, True),  # the default, mlbench-runner train
        ({"taskSnapshot": {"runner": {"image": "x", "command": ["mlbench-runner", "collectives"]}}}, True),
        ({"taskSnapshot": {"runner": {"image": "x", "command": ["/opt/trainer/train"]}}}, False),
        ({"taskSnapshot": {"runner": {"command": "not a list"}}}, None),
    ],
)
def test_serves_metrics_follows_the_task_snapshots_runner(status: dict[str, Any], serves: bool | None) -> None:
    from mlbench_operator import metrics as m
    from mlbench_operator.run import status as run_status

    assert run_status.serves_metrics(status) is serves
    m.track_phase(("ns", "served"), "Running", task="t", serves_metrics=serves)
    value = REGISTRY.get_sample_value("mlbench_operator_run_serves_metrics", {"namespace": "ns", "run": "served"})
    if serves is not None:
        assert value == (1.0 if serves else 0.0)
    m.track_phase(("ns", "served"), None, deleted=True, task="t")
    assert (
        REGISTRY.get_sample_value("mlbench_operator_run_serves_metrics", {"namespace": "ns", "run": "served"}) is None
    )


#: Pod Security admission's refusal of an nfs dataset volume in a restricted namespace, as the API server words it.
POD_SECURITY = (
    'pods "r1-worker-0" is forbidden: violates PodSecurity "restricted:latest": restricted volume types '
    '(volume "data" uses restricted volume type "nfs")'
)


@pytest.mark.parametrize(
    ("code", "detail", "final"),
    [
        (422, "spec.containers[0].image: Required value", "CreateFailed"),  # never valid
        (403, POD_SECURITY, "PolicyViolation"),  # the same pod is built on every retry
        (403, "exceeded quota: q, requested: pods=1, used: pods=10, limited: pods=10", None),  # may free up
        (403, 'admission webhook "w.example.com" denied the request: busy', None),
        (409, "already exists", None),
    ],
)
def test_which_refusals_are_final(code: int, detail: str, final: str | None) -> None:
    assert lifecycle.refusal_is_final(code, detail) == final


def test_a_pod_security_refusal_fails_the_run_naming_the_volume() -> None:
    """An nfs dataset volume in a restricted namespace: the run fails PolicyViolation at once (it retried with
    backoff until its deadline), with the refusal's text, however many quota refusals came with it."""
    body, _ = admitted(h.run())
    quota = "exceeded quota: q, requested: pods=1, used: pods=10, limited: pods=10"
    plan = lifecycle.creation_failed(
        body, [("pod r1-worker-1", 403, quota), ("pod r1-worker-0", 403, POD_SECURITY)], T0
    )
    assert plan.terminal
    failed = cond(plan.status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "PolicyViolation")
    assert 'restricted volume type "nfs"' in plan.status["message"]
    assert plan.events[0][:2] == ("Warning", "Failed")


def test_a_container_the_kernel_killed_names_its_memory_limit() -> None:
    """OOMKilled by the runtime without the worker's own words (the kernel chose the worker itself): the
    message still names the limit the user set."""
    _body, ctx = admitted(h.run(resources={"cpu": "1", "memory": "256Mi"}))
    oom = terminated(runpods.worker_pod(ctx, 0, 0), 137, reason="OOMKilled")
    reason, message = oom.failure()
    assert reason == "OOMKilled"
    assert "memory limit 256Mi" in message, message
