"""The GPU benchmark's speed-up lines (benchmarks/runner_gpu_time_to_accuracy.py), from saved results.

Issue 11's ratio is plain over fast in one run; the per-epoch ratio is printed beside it because the
time to goal also depends on how many epochs each path happened to need (an H100 run: 5.43x to the
goal, 4.67x per epoch, 15 against 13 epochs).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "runner_gpu_time_to_accuracy.py"


def _speedups(results: dict[str, dict[str, Any]]) -> list[str]:
    spec = importlib.util.spec_from_file_location("runner_gpu_time_to_accuracy", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines: list[str] = module.speedups(results)
    return lines


def _path(goal: float | None, epochs: float, per_epoch: float) -> dict[str, Any]:
    return {"time_to_goal_s": goal, "epochs": epochs, "wall_s_per_epoch": per_epoch}


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        pytest.param(
            {"fast": _path(40.4, 13, 3.05), "plain": _path(219.4, 15, 14.25)},
            ["plain / fast: time to goal 5.43x (15 against 13 epochs), per epoch 4.67x"],
            id="the H100 run",
        ),
        pytest.param(
            {"fast": _path(10.0, 2, 1.0), "compiled": _path(None, 3, 0.5), "plain": _path(40.0, 4, 4.0)},
            [
                "plain / fast: time to goal 4.00x (4 against 2 epochs), per epoch 4.00x",
                "plain / compiled: time to goal - (4 against 3 epochs), per epoch 8.00x",
            ],
            id="one path short of the goal",
        ),
        pytest.param({"fast": _path(10.0, 2, 1.0)}, [], id="no plain path"),
    ],
)
def test_plain_over_each_runner_path(results: dict[str, dict[str, Any]], expected: list[str]) -> None:
    assert _speedups(results) == expected
