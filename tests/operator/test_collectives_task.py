"""A collectives task (task 0a) through the operator's decisions: admitted without data, no dataset volume
or fetch, and a finished sweep's peak bus bandwidths in ``status.result``."""

from __future__ import annotations

import copy
from typing import Any

from mlbench_api.catalog import load_catalog
from mlbench_api.results import CollectiveResult, RunSummary
from mlbench_operator import conditions as c
from mlbench_operator import runcontext, runpods
from mlbench_operator.run import admission
from tests.factories import collectives_summary
from tests.operator import helpers as h
from tests.operator.test_reconcile import T0, cond, pod, step, terminated

TASK: dict[str, Any] = {
    "apiVersion": "mlbench.io/v1alpha1",
    "kind": "BenchmarkTask",
    "metadata": {"name": h.TASK_NAME},
    "spec": {
        "division": "closed",
        "collectives": {"maxBytes": 1048576},
        "runner": {"image": "localhost/mlbench/mlbench-runner:test", "command": ["mlbench-runner", "collectives"]},
    },
}


def admitted(**spec: Any) -> tuple[dict[str, Any], runcontext.RunContext]:
    body = h.run(**spec)
    result = admission.admit(body, copy.deepcopy(TASK))
    assert not isinstance(result, admission.Rejection), result
    ctx, snapshot = result
    assert "training" not in snapshot
    assert "collectives" in snapshot
    return {**body, "status": admission.admitted_status(body, ctx, snapshot, T0)}, ctx


def test_a_collectives_run_is_admitted_without_data() -> None:
    _, ctx = admitted(backend="mpi")
    assert ctx.config.task.collectives is not None
    assert ctx.config.goal_target_value is None
    assert ctx.config.lr_schedule is None
    for obj in (runpods.worker_pod(ctx, 0, 0), runpods.launcher_pod(ctx, 0)):
        volumes = {v["name"] for v in obj["spec"].get("volumes", [])}
        assert "data" not in volumes


def test_the_catalog_task_is_admitted() -> None:
    task = load_catalog()["backend-collectives"]
    result = admission.admit(h.run(task_name="backend-collectives", workers=4), task.to_api())
    assert not isinstance(result, admission.Rejection), result
    assert result[0].config.task.runner.command == ["mlbench-runner", "collectives"]


def test_overrides_and_algorithms_are_refused_with_the_field() -> None:
    refused = admission.admit(h.run(overrides={"maxEpochs": 2}), copy.deepcopy(TASK))
    assert isinstance(refused, admission.Rejection)
    assert refused.reason == c.Reason.OVERRIDE_NOT_ALLOWED
    assert refused.message.startswith("spec.overrides: maxEpochs")
    refused = admission.admit(h.run(algorithm="powersgd"), copy.deepcopy(TASK))
    assert isinstance(refused, admission.Rejection)
    assert refused.reason == c.Reason.ALGORITHM_NOT_ALLOWED
    assert refused.message.startswith("spec.algorithm: ")


def sweep_summary() -> RunSummary:
    result = CollectiveResult(backend="gloo", world_size=2, device="cpu", warmup_iterations=5, rows=[])
    return collectives_summary(
        result,
        steps=480,
        wall_clock_seconds=30.0,
        train_seconds=12.0,
        communication_seconds=12.0,
        peak_bus_bandwidth={"all-reduce": 2.5e9, "all-gather": 1.25e9, "broadcast": 3e9},
    )


def test_a_finished_sweep_reports_its_peaks() -> None:
    body, ctx = admitted()
    ready = [pod(runpods.worker_pod(ctx, r, 0)) for r in range(ctx.spec.workers)]
    body, plan = step(body, ctx, ready, T0)
    summary = sweep_summary()
    done = terminated(runpods.launcher_pod(ctx, 0), 0, summary.termination_message())
    body, plan = step(body, ctx, [*ready, done], T0)
    st = plan.status
    assert st["phase"] == "Succeeded"
    assert st["result"]["peakBusBandwidth"] == {"all-reduce": 2.5e9, "all-gather": 1.25e9, "broadcast": 3e9}
    assert st["result"]["goalReached"] is True
    assert cond(st, "Succeeded")["status"] == "True"
