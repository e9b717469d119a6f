"""Real multi-process runs over gloo: agreement, equivalence, schedules, collective stop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mlbench_api.results import RunSummary
from mlbench_runner.schedule import learning_rate

from .helpers import launch_processes, logreg_task, make_config, resnet_task, write_cifar_python

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


@pytest.mark.parametrize(
    ("ranks", "algorithm", "bucketing"),
    [(2, "allreduce-sgd", "by-model"), (2, "allreduce-sgd", "by-layer"), (2, "ddp", "by-model")],
)
def test_resnet_ranks_identical_every_step(tmp_path: Path, ranks: int, algorithm: str, bucketing: str) -> None:
    # ddp: 1001 test images give the two ranks 501 and 500, i.e. 2 and 1 evaluation batches.
    data = write_cifar_python(tmp_path, n_train=80, n_test=1001 if algorithm == "ddp" else 20)
    task = resnet_task(data, batch=8, epochs=2, subset=64, warmup=1, milestones=[1])
    config = make_config(task, tmp_path / "out", ranks, algorithm=algorithm, bucketing=bucketing)
    recs = launch_processes(config, ranks, MLBENCH_TRACE_PARAMS="1")
    steps = 2 * (64 // (8 * ranks))
    for rec in recs:
        assert rec["steps"] == steps
        assert rec["param_sha1"] == recs[0]["param_sha1"], "ranks diverged"
    assert len(set(recs[0]["param_sha1"])) == steps  # the parameters really changed every step
    # ... and they evaluated one model: BatchNorm running statistics identical at every evaluation.
    assert len(recs[0]["buffer_sha1"]) == 2
    for rec in recs:
        assert rec["buffer_sha1"] == recs[0]["buffer_sha1"], "ranks evaluated different BatchNorm statistics"
    # The trainer used the schedule: warm-up start, end of warm-up, then the milestone decay.
    spe = steps // 2
    assert recs[0]["lrs"] == [learning_rate(config.lr, s, spe) for s in range(steps)]
    assert recs[0]["lrs"][0] == pytest.approx(0.1 / 256 * 8)
    assert recs[0]["lrs"][spe] == pytest.approx(0.1 / 256 * 8 * ranks * 0.1)
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    assert summary.environment.world_size == ranks
    assert summary.steps == steps
    assert summary.samples == steps * 8 * ranks
    assert len(summary.history) == 2
    assert len(summary.termination_message().encode()) < 4096
    # the summary compares the ranks' final parameters itself (what the e2e tests read from real pods)
    assert summary.parameter_digests == [recs[0]["param_sha1"][-1]] * ranks
    if algorithm == "allreduce-sgd":
        assert summary.communication_seconds > 0


def test_the_result_names_each_rank_s_node(tmp_path: Path) -> None:
    """Each rank's MLBENCH_NODE_NAME (its pod's spec.nodeName) is gathered once and kept in rank order."""
    task = logreg_task(batch=5, epochs=1, train=40, features=4)
    nodes = [{"MLBENCH_NODE_NAME": "node-b"}, {"MLBENCH_NODE_NAME": "node-a"}]
    launch_processes(make_config(task, tmp_path / "out", 2), 2, rank_env=nodes)
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    assert summary.environment.nodes == ["node-b", "node-a"]
    hardware = summary.environment.hardware  # each rank's own record: its node, the driver and CUDA it sees
    assert hardware is not None
    assert [(r.node, r.cuda) for r in hardware] == [("node-b", torch.version.cuda), ("node-a", torch.version.cuda)]


def test_logreg_k_workers_match_one_big_batch(tmp_path: Path) -> None:
    """k workers x batch b == 1 worker x batch k*b, step for step (fp64)."""
    k, b = 4, 5
    task = logreg_task(batch=b, epochs=2, train=200, features=12, alpha=3.0)
    many = launch_processes(make_config(task, tmp_path / "k", k), k, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64")
    task_big = logreg_task(batch=k * b, epochs=2, train=200, features=12, alpha=3.0)
    one = launch_processes(
        make_config(task_big, tmp_path / "one", 1), 1, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64"
    )
    for rec in many[1:]:
        assert rec["param_sha1"] == many[0]["param_sha1"], "4 ranks diverged"
    a = np.asarray(many[0]["param_values"])
    c = np.asarray(one[0]["param_values"])
    assert a.shape == c.shape == (2 * 200 // (k * b), 12)
    assert np.abs(a).max() > 0.1  # it learned something
    np.testing.assert_allclose(a, c, rtol=1e-11, atol=1e-13)


def test_goal_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    task = logreg_task(batch=10, epochs=20, train=800, features=20, target=0.8, alpha=2.0)
    recs = launch_processes(make_config(task, tmp_path / "out", 4), 4)
    assert {r["stop_reason"] for r in recs} == {"goal"}
    assert len({r["steps"] for r in recs}) == 1
    assert recs[0]["epochs_completed"] < 20
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    assert summary.goal_reached
    assert summary.status == "success"
    assert summary.best_accuracy is not None
    assert summary.best_accuracy >= 0.8
    assert summary.time_to_goal_seconds is not None
    assert summary.time_to_goal_seconds <= summary.wall_clock_seconds
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    names = [e["event"] for e in events]
    for required in ("run_start", "hyperparameters", "epoch_start", "epoch_stop", "eval_accuracy", "run_stop"):
        assert required in names
    assert next(e for e in events if e["event"] == "run_stop")["status"] == "success"


def test_time_budget_stops_ranks_together(tmp_path: Path) -> None:
    """accuracy-after-time: the budget is checked collectively, then a final evaluation."""
    task = logreg_task(batch=10, epochs=100_000, train=2000, features=200, target=0.6)
    task["goal"] = {"target": 0.6, "metric": "test-accuracy", "mode": "accuracy-after-time", "timeBudgetSeconds": 2}
    recs = launch_processes(make_config(task, tmp_path / "out", 2), 2)
    assert {r["stop_reason"] for r in recs} == {"time-budget"}
    assert recs[0]["steps"] == recs[1]["steps"]
    assert recs[0]["accuracies"] == recs[1]["accuracies"]
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    assert summary.wall_clock_seconds >= 2
    assert summary.final_accuracy is not None
    assert summary.goal_reached == (summary.final_accuracy >= 0.6)
    assert summary.status == ("success" if summary.goal_reached else "goal-not-reached")
