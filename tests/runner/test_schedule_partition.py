"""Learning-rate boundaries and data partitions (pure functions, no processes)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from mlbench_api.config import ResolvedSchedule, resolve_schedule
from mlbench_api.schedule import LearningRate, Schedule
from mlbench_runner.rank import partition
from mlbench_runner.schedule import learning_rate


def test_multistep_1a_boundaries() -> None:
    lr = LearningRate(schedule=Schedule.MULTI_STEP, per_sample=0.1 / 256, warmup_epochs=5, milestones=[82, 109])
    sched = resolve_schedule(lr, batch=32, world_size=8)
    spe = 100
    eta_b = 0.1 / 256 * 32
    assert learning_rate(sched, 0, spe) == pytest.approx(eta_b, rel=1e-15)
    half = learning_rate(sched, 250, spe)
    assert half == pytest.approx(eta_b + (eta_b * 8 - eta_b) * 0.5, rel=1e-12)
    assert learning_rate(sched, 499, spe) < eta_b * 8
    assert learning_rate(sched, 500, spe) == pytest.approx(eta_b * 8, rel=1e-15)
    assert learning_rate(sched, 82 * spe - 1, spe) == pytest.approx(eta_b * 8, rel=1e-15)
    assert learning_rate(sched, 82 * spe, spe) == pytest.approx(eta_b * 8 * 0.1, rel=1e-12)
    assert learning_rate(sched, 109 * spe - 1, spe) == pytest.approx(eta_b * 8 * 0.1, rel=1e-12)
    assert learning_rate(sched, 109 * spe, spe) == pytest.approx(eta_b * 8 * 0.01, rel=1e-12)


def test_multistep_is_linear_per_step() -> None:
    sched = ResolvedSchedule(schedule=Schedule.MULTI_STEP, initial_lr=0.1, peak_lr=0.5, warmup_epochs=2)
    values = [learning_rate(sched, s, 10) for s in range(21)]
    diffs = {round(b - a, 12) for a, b in itertools.pairwise(values)}
    assert diffs == {0.02}
    assert values[20] == 0.5


@pytest.mark.parametrize(("workers", "alpha"), [(1, 200), (2, 400), (3, 400), (4, 600), (8, 700), (64, 800)])
def test_inverse_sqrt_2a(workers: int, alpha: float) -> None:
    table = [{"minWorkers": k, "alpha": a} for k, a in ((1, 200), (2, 400), (4, 600), (8, 700), (16, 800))]
    lr = LearningRate.model_validate({"schedule": "inverse-sqrt", "alphaByWorkers": table})
    sched = resolve_schedule(lr, batch=100, world_size=workers)
    for t in (1, 2, 4, 100, 12345):
        assert learning_rate(sched, t - 1, 50) == pytest.approx(alpha / math.sqrt(t), rel=1e-15)


def test_bad_steps_per_epoch() -> None:
    sched = ResolvedSchedule(schedule=Schedule.CONSTANT, initial_lr=0.1, peak_lr=0.1)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        learning_rate(sched, 0, 0)


@pytest.mark.parametrize(("n", "batch", "world"), [(100, 8, 1), (100, 8, 2), (1000, 7, 4), (33, 4, 4)])
def test_partitions_disjoint_cover_equal(n: int, batch: int, world: int) -> None:
    for epoch in range(3):
        shards = [partition.shard(n, batch, r, world, seed=5, epoch=epoch) for r in range(world)]
        steps = partition.steps_per_epoch(n, batch, world)
        assert all(len(s) == steps * batch for s in shards)
        union = torch.cat(shards)
        assert len(set(union.tolist())) == len(union)  # disjoint
        used = steps * batch * world
        assert set(union.tolist()) == set(partition.epoch_permutation(n, 5, epoch)[:used].tolist())
        assert n - used < batch * world  # only a partial global batch is dropped
    e0 = partition.shard(n, batch, 0, world, seed=5, epoch=0)
    e1 = partition.shard(n, batch, 0, world, seed=5, epoch=1)
    assert not torch.equal(e0, e1)  # reshuffled every epoch


def test_strided_shards_equal_one_big_batch() -> None:
    n, b, k = 120, 5, 4
    big = partition.shard(n, b * k, 0, 1, seed=1, epoch=0)
    for step in range(n // (b * k)):
        small = torch.cat([partition.shard(n, b, r, k, seed=1, epoch=0)[step * b : (step + 1) * b] for r in range(k)])
        assert set(small.tolist()) == set(big[step * b * k : (step + 1) * b * k].tolist())


def test_eval_shards_cover_test_set() -> None:
    parts = [partition.eval_shard(101, r, 4) for r in range(4)]
    assert sorted(torch.cat(parts).tolist()) == list(range(101))


def test_too_few_samples_names_field() -> None:
    with pytest.raises(ValueError, match="batchSizePerWorker"):
        partition.steps_per_epoch(10, 8, 2)
