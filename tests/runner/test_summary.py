"""The RunSummary a rank builds from its timings and evaluations: what is reported for runs that end other than
by reaching the goal (no builder internals: the summary as status.result and `mlbench results` read it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mlbench_runner.rank.summary import SummaryBuilder
from mlbench_runner.timing import StepTiming
from mlbench_runner.world import World

from .helpers import logreg_task, make_config

pytestmark = pytest.mark.multiproc


ONE = World(0, 1, 0, 1, "127.0.0.1", 0, "single")


def _builder(tmp_path: Path, **goal: Any) -> SummaryBuilder:
    task = logreg_task(target=0.8)
    task["goal"] = {**task["goal"], **goal}
    return SummaryBuilder(make_config(task, tmp_path, 1), ONE, torch.device("cpu"), "fp32")


@pytest.mark.parametrize(
    ("final", "reached", "time_to_goal"),
    [
        pytest.param(0.79, False, None, id="crossed the target, ended below it: no time to goal"),
        pytest.param(0.85, True, 300.0, id="ended above it"),
    ],
)
def test_an_accuracy_after_time_run_below_the_target_has_no_time_to_goal(
    tmp_path: Path, final: float, reached: bool, time_to_goal: float | None
) -> None:
    """kubectl's TIME-TO-GOAL column must not show a time for a run that says it missed the goal."""
    builder = _builder(tmp_path, mode="accuracy-after-time", timeBudgetSeconds=600)
    builder.add_epoch(1, 0.81, 0.5, 300.0, 0.1)
    builder.time_to_goal = 300.0  # what the trainer records when an evaluation first meets the target
    builder.add_epoch(2, final, 0.5, 600.0, 0.1)
    builder.stop(200, 2.0, 600.0)
    summary = builder.build("success" if reached else "goal-not-reached", "time-budget")
    assert summary.goal_reached is reached
    assert summary.time_to_goal_seconds == time_to_goal


def test_samples_per_second_counts_only_the_timed_steps(tmp_path: Path) -> None:
    """A run stopped at step 74 whose timer was last read at step 50: 24 steps without a time must not add
    samples over the 50 steps' time (1.48x too high here), and the summary agrees with the live gauge."""
    builder = _builder(tmp_path)
    builder.add_steps([StepTiming(step, {"forward": 0.004, "backward": 0.006}) for step in range(50)])
    builder.stop(74, 0.5, 2.0)
    summary = builder.build("aborted", "error")
    assert summary.samples == 74 * 10
    assert summary.samples_per_second == pytest.approx(50 * 10 / 0.5)
    assert summary.samples_per_second == pytest.approx(builder.throughput())
