"""A rank's set-up. One-time work that takes one rank longer than the others (a pod without the dataset
cache decodes it; a compile takes longer on one rank) stays out of the run's clock: rank 0 would otherwise wait
for it in the run's first collective, inside its wall clock and its communication phase. And the threads that
a CPU limit gives."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from mlbench_api.config import RunConfig
from mlbench_api.results import RunSummary
from mlbench_runner.options import Options
from mlbench_runner.rank import session
from mlbench_runner.rank import setup as rank_setup
from mlbench_runner.rank.session import waited_for_others
from mlbench_runner.rank.steps import FastStep
from mlbench_runner.rank.train import Trainer
from mlbench_runner.world import World

from .helpers import join_all, logreg_task, make_config, spawn_ranks

#: Seconds rank 1's set-up takes beyond rank 0's: far above what the tiny run itself takes, so that the clock
#: tells whether the wait is in it.
SKEW = 5.0


@pytest.mark.parametrize(
    ("waited", "own", "slowest", "excluded"),
    [
        pytest.param(5.2, 0.0, 5.0, 5.0, id="another rank decoded: its decode, not the skew beyond it"),
        pytest.param(0.0, 5.0, 5.0, 0.0, id="this rank was the slowest: nothing more"),
        pytest.param(1.1, 4.0, 5.0, 1.0, id="both decoded: the difference"),
        pytest.param(0.3, 0.0, 5.0, 0.3, id="the other rank started earlier: never more than the wait"),
        pytest.param(2.0, 0.0, 0.0, 0.0, id="no set-up anywhere: a later start is the run's time"),
    ],
)
def test_the_wait_for_slower_ranks_set_up(waited: float, own: float, slowest: float, excluded: float) -> None:
    assert waited_for_others(waited, own, slowest) == pytest.approx(excluded)


def _rank(rank: int, port: int, out: str, where: str) -> None:
    """One of two gloo ranks in a spawned process; rank 1's ingest or compile takes SKEW seconds longer."""
    if where == "ingest":
        real_load = rank_setup.load_dataset

        def load(spec: Any) -> Any:
            data = real_load(spec)
            if rank == 1:  # as a decode into a missing cache would
                time.sleep(SKEW)
                data = dataclasses.replace(data, ingest_seconds=data.ingest_seconds + SKEW)
            return data

        rank_setup.load_dataset = load
    else:
        torch.compile = lambda model, **_: model  # type: ignore[assignment]

        def warm_up(self: FastStep, x: torch.Tensor, y: torch.Tensor) -> float:
            seconds = SKEW + 0.1 if rank == 1 else 0.1
            time.sleep(seconds)
            return seconds

        FastStep.warm_up = warm_up  # type: ignore[method-assign]
    config = RunConfig.model_validate_json((Path(out) / "config.json").read_text())
    world = World(rank, 2, rank, 2, "127.0.0.1", port, "env")
    Trainer(config, world, Options(max_steps=4, compile="1" if where == "compile" else "0")).run()


@pytest.mark.multiproc
@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["ingest", "compile"])
def test_a_slower_ranks_set_up_is_not_in_rank_0s_clock(tmp_path: Path, where: str) -> None:
    config = make_config(logreg_task(batch=10, epochs=1, train=100, features=8), tmp_path, 2)
    (tmp_path / "config.json").write_text(config.dump())
    join_all(spawn_ranks(_rank, str(tmp_path), where), timeout=150)
    summary = RunSummary.model_validate_json((tmp_path / "summary.json").read_text())
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    if where == "ingest":
        (hyper,) = [e for e in events if e["event"] == "hyperparameters"]
        assert hyper["dataset"]["ingest_wait_s"] >= SKEW - 2  # less any head start rank 1 had
    else:
        (fast,) = [e for e in events if e["event"] == "fast_path"]
        assert fast["capture_s"] >= SKEW - 2  # its own 0.1 s and the wait for rank 1's, less any head start
        assert summary.communication_seconds < SKEW / 2
    assert summary.wall_clock_seconds < SKEW / 2, summary.wall_clock_seconds


@pytest.mark.parametrize(
    ("cpu_max", "cpus"),
    [
        ("250000 100000\n", 2),  # the spec's 2.5 CPUs per worker: 2 threads, not 3 throttled ones
        ("200000 100000\n", 2),
        ("55000 100000\n", 1),  # the e2e's 550m: never 0
        ("max 100000\n", None),
        ("garbage\n", None),
    ],
)
def test_threads_from_a_cpu_limit_round_down(cpu_max: str, cpus: int | None) -> None:
    assert session.quota_cpus(cpu_max) == cpus
