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


def _benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("runner_gpu_time_to_accuracy", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _speedups(results: dict[str, dict[str, Any]]) -> list[str]:
    lines: list[str] = _benchmark().speedups(results)
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


def test_the_lease_puts_plain_over_the_closed_paths_of_every_stage() -> None:
    """The lease runs compiled in a stage of its own: its report puts core's plain over it; the smoke run (a
    subset) and the open division (bf16) are not closed-division runs and stay out."""

    def record(results: dict[str, dict[str, Any]], bf16: bool = False, subset: int | None = None) -> dict[str, Any]:
        return {"args": {"bf16": bf16, "subset": subset}, "results": results}

    fast, plain, compiled = _path(40.4, 13, 3.05), _path(219.4, 15, 14.25), _path(41.2, 13, 2.57)
    records = [
        ("smoke", record({"fast": _path(None, 1, 0.78)}, subset=4096)),
        ("core", record({"fast": fast, "plain": plain})),
        ("compiled", record({"compiled": compiled})),
        ("open", record({"fast": _path(28.1, 11, 2.48)}, bf16=True)),
    ]
    assert _benchmark().lease_paths(records) == {"core:fast": fast, "plain": plain, "compiled:compiled": compiled}
