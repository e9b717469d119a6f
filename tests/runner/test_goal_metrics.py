"""Time-to-target and accuracy-after-time for the Trainer's goal metrics (accuracy, loss): the runner compares the
metric's value in its direction (lower is better for loss), and the summary carries it. BLEU and perplexity are
the translation kind's (test_translation.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from mlbench_api.results import RunSummary
from mlbench_runner.goals import epoch_score, perplexity
from mlbench_runner.options import Options
from mlbench_runner.rank.train import Trainer
from mlbench_runner.world import World
from tests.factories import read_summary

from .helpers import logreg_task, make_config

SINGLE = World(0, 1, 0, 1, "127.0.0.1", 0, "single")


def run_with_evaluations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, goal: dict[str, Any], evaluations: list[tuple[float, float]]
) -> RunSummary:
    """A logistic-regression run whose evaluations return ``evaluations`` (accuracy, loss) in turn."""
    task = logreg_task(batch=10, epochs=len(evaluations), train=100, features=8)
    task["goal"] = goal
    config = make_config(task, tmp_path / "out", 1)
    results = iter(evaluations)
    monkeypatch.setattr(Trainer, "_evaluate", lambda self, s: next(results))
    Trainer(config, SINGLE, Options()).run()
    return read_summary(tmp_path / "out")


@pytest.mark.multiproc
def test_a_loss_goal_stops_when_the_loss_falls_to_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = run_with_evaluations(
        tmp_path, monkeypatch, {"metric": "loss", "target": 0.3}, [(0.9, 0.9), (0.9, 0.5), (0.5, 0.2), (0.9, 0.1)]
    )
    assert summary.goal_reached
    assert summary.stop_reason == "goal"
    assert summary.goal_metric == "loss"
    assert [h.score for h in summary.history] == [0.9, 0.5, 0.2]  # the high accuracy of epoch 1 does not count
    assert summary.final_score == summary.best_score == 0.2
    assert summary.time_to_goal_seconds == summary.history[-1].wall_seconds


@pytest.mark.multiproc
@pytest.mark.parametrize(("last_loss", "reached"), [(0.25, True), (0.4, False)])
def test_loss_after_time_judges_the_last_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, last_loss: float, reached: bool
) -> None:
    goal = {"metric": "loss", "target": 0.3, "mode": "accuracy-after-time", "timeBudgetSeconds": 600}
    summary = run_with_evaluations(tmp_path, monkeypatch, goal, [(0.5, 0.2), (0.5, 0.5), (0.5, last_loss)])
    assert summary.stop_reason == "max-epochs"
    assert summary.goal_reached is reached
    assert summary.best_score == 0.2
    assert summary.final_score == last_loss


@pytest.mark.multiproc
def test_an_accuracy_goal_is_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = run_with_evaluations(
        tmp_path, monkeypatch, {"metric": "test-accuracy", "target": 0.8}, [(0.5, 0.1), (0.85, 0.9)]
    )
    assert summary.goal_reached
    assert summary.goal_metric == "test-accuracy"
    assert summary.final_score == summary.final_accuracy == 0.85


def test_epoch_score_per_metric() -> None:
    from mlbench_api.goal import GoalMetric

    assert epoch_score(GoalMetric.TEST_TOP1_ACCURACY, 0.7, 2.0) == 0.7
    assert epoch_score(GoalMetric.LOSS, 0.7, 2.0) == 2.0
    assert epoch_score(GoalMetric.PERPLEXITY, 0.7, 2.0) == pytest.approx(math.exp(2.0))
    assert epoch_score(GoalMetric.BLEU, 0.7, 2.0, bleu=31.5) == 31.5
    with pytest.raises(ValueError, match="bleu needs"):
        epoch_score(GoalMetric.BLEU, 0.7, 2.0)
    assert perplexity(1e6) == math.inf
    assert math.isnan(perplexity(math.nan))
