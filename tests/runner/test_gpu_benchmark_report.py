"""The GPU benchmark's speed-up lines (benchmarks/runner_gpu_time_to_accuracy.py), from saved results.

Issue 11's ratio is plain over fast in one run; the per-epoch ratio is printed beside it because the
time to goal also depends on how many epochs each path happened to need (an H100 run: 5.43x to the
goal, 4.67x per epoch, 15 against 13 epochs).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlbench_runner.options import Options
from tests.scripts import REPO, load_script

#: loaded when the tests are collected: its imports start processes (torch's first import), which a unit test may not
benchmark = load_script("benchmarks/runner_gpu_time_to_accuracy.py")


def _speedups(results: dict[str, dict[str, Any]]) -> list[str]:
    lines: list[str] = benchmark.speedups(results)
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
    assert benchmark.lease_paths(records) == {"core:fast": fast, "plain": plain, "compiled:compiled": compiled}


def _record(results: dict[str, dict[str, Any]], seed: int | None = None, **args: Any) -> dict[str, Any]:
    """A saved invocation; ``seed`` None: a file from before ``--seed`` (the default seed, 42)."""
    base = {"bf16": False, "subset": None, **args}
    return {"args": base if seed is None else {**base, "seed": seed}, "results": results}


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        pytest.param(
            [
                ("core", _record({"fast": _path(40.0, 13, 3.0), "plain": _path(220.0, 15, 14.0)})),
                ("seed2", _record({"fast": _path(44.0, 14, 3.2)}, seed=2)),
                ("seed3", _record({"fast": _path(None, 164, 3.1)}, seed=3)),
            ],
            [
                "fast: 3 runs (seeds 42, 2, 3): time to goal 40.0 s, 44.0 s, not reached; mean -; "
                "s/epoch (+eval) mean 3.10",
                "plain / fast, means: time to goal -, per epoch 4.52x",
            ],
            id="a run short of the goal has no mean to the goal",
        ),
        pytest.param(
            [
                ("core", _record({"fast": _path(40.0, 13, 3.0), "plain": _path(220.0, 15, 14.0)})),
                ("compiled", _record({"compiled": _path(34.0, 13, 2.5)})),
                ("seed2", _record({"fast": _path(44.0, 14, 3.2), "compiled": _path(36.0, 14, 2.5)}, seed=2)),
                ("open", _record({"fast": _path(28.0, 11, 2.4)}, seed=2, bf16=True)),
                ("smoke", _record({"fast": _path(None, 1, 0.8)}, seed=2, subset=4096)),
            ],
            [
                "fast: 2 runs (seeds 42, 2): time to goal 40.0 s, 44.0 s; mean 42.0 s; s/epoch (+eval) mean 3.10",
                "plain / fast, means: time to goal 5.24x, per epoch 4.52x",
                "compiled: 2 runs (seeds 42, 2): time to goal 34.0 s, 36.0 s; mean 35.0 s; s/epoch (+eval) mean 2.50",
                "plain / compiled, means: time to goal 6.29x, per epoch 5.60x",
            ],
            id="the open division and the subset stay out",
        ),
        pytest.param(
            [("core", _record({"fast": _path(40.0, 13, 3.0), "plain": _path(220.0, 15, 14.0)}))],
            [],
            id="every path once: nothing to add to the lease's lines",
        ),
    ],
)
def test_paths_run_more_than_once_get_their_mean(
    records: list[tuple[str, dict[str, Any]]], expected: list[str]
) -> None:
    assert benchmark.over_runs(records) == expected


@pytest.mark.parametrize(
    ("path", "fast_path", "compiled"),
    [
        ("fast", "auto", "0"),  # the graphs alone: the runner's default compiles them on a GPU, `compiled` does
        ("compiled", "auto", "1"),
        ("eager", "off", "0"),
        ("ddp", "off", "0"),
    ],
)
def test_each_runner_path_sets_its_own_knobs(path: str, fast_path: str, compiled: str) -> None:
    """Each row says what it ran whatever the runner's defaults are (MLBENCH_COMPILE became auto)."""
    opts = benchmark.runner_options(Options(), path)
    assert (opts.fast_path, opts.compile) == (fast_path, compiled)


def test_the_saved_h100_confirmation_gives_docs_figures() -> None:
    """docs/runner.md's three-seed means come from the JSON files the H100 lease wrote (kept under
    benchmarks/results/), through the same report code that a later lease will run."""
    folder = REPO / "benchmarks" / "results" / "h100-2026-11-27-confirm"
    records = [
        (name, json.loads((folder / f"{name}.json").read_text())) for name in ("core", "compiled", "seed2", "seed3")
    ]
    assert benchmark.over_runs(records) == [
        "fast: 3 runs (seeds 42, 2, 3): time to goal 38.1 s, 38.5 s, 46.6 s; mean 41.1 s; s/epoch (+eval) mean 3.10",
        "plain / fast, means: time to goal 6.51x, per epoch 5.60x",
        "compiled: 3 runs (seeds 42, 2, 3): time to goal 34.3 s, 39.3 s, 38.5 s; mean 37.4 s; "
        "s/epoch (+eval) mean 2.78",
        "plain / compiled, means: time to goal 7.15x, per epoch 6.26x",
    ]
    docs = (REPO / "docs" / "runner.md").read_text()
    for figure in ("**41.1 s**", "**37.4 s**", "**7.15\N{MULTIPLICATION SIGN}**", "**6.26\N{MULTIPLICATION SIGN}**"):
        assert figure in docs, figure
