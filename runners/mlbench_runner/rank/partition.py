"""Disjoint per-rank data shards, reshuffled every epoch from one seeded permutation.

Every rank draws the same global permutation for (seed, epoch), drops the tail so that
each rank gets the same whole number of batches, and takes every k-th index starting at
its rank. Strided (not blocked) shards make step s of k workers with batch b see exactly
the samples that step s of one worker with batch k*b sees.
"""

from __future__ import annotations

import torch


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The global order of the ``n`` training samples for ``epoch`` (same on every rank)."""
    g = torch.Generator()
    g.manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def steps_per_epoch(n: int, batch: int, world_size: int) -> int:
    """Whole global batches in ``n`` samples; fails clearly when there is not even one."""
    steps = n // (batch * world_size)
    if steps < 1:
        raise ValueError(
            f"training.batchSizePerWorker: {batch} x {world_size} workers exceeds the {n} training samples"
        )
    return steps


def shard(n: int, batch: int, rank: int, world_size: int, *, seed: int, epoch: int) -> torch.Tensor:
    """Indices rank ``rank`` trains on in ``epoch``, in step order (steps x batch of them)."""
    used = steps_per_epoch(n, batch, world_size) * batch * world_size
    return epoch_permutation(n, seed, epoch)[:used][rank::world_size]


def eval_shard(n: int, rank: int, world_size: int) -> torch.Tensor:
    """Test indices evaluated by ``rank``: all of them across ranks, none twice."""
    return torch.arange(rank, n, world_size)
