"""One translation optimizer step through a registry algorithm (powersgd, sign-sgd, sparsified-sgd,
decentralized-sgd, ddp) instead of the loop's fused all-reduce (:func:`~.optim.accumulated_step`).

The step's statistics and its gradient travel apart: every micro-batch is back-propagated into the algorithm's
gradient buffers (loss times the loss scale, as the fused step); one small all-reduce sums the loss, the target
tokens, the sentences and this rank's count of non-finite gradient entries, so every rank sees the same totals
and takes the same loss-scaler decision; the gradient is then deflated, handed to the algorithm, clipped and
applied by the recipe's Adam (:func:`mlbench_runner.algorithms.loop_step.registry_step`, shared with the
language-model loop):

* gradient-averaging algorithms (:data:`~mlbench_runner.algorithms.loop_step.AVERAGING`: powersgd, sign-sgd,
  sparsified-sgd) average over ranks, so each rank deflates by ``scale * (all ranks' tokens, or sentences) /
  world``: their exact average would be the fused step's gradient, and what they send instead is their
  compression of it;
* ddp (torch DistributedDataParallel) averages too, inside backward: every micro-batch but the last is
  back-propagated under the wrapper's ``no_sync()``, so its reducer all-reduces the accumulated gradient once per
  optimizer step, during the last micro-batch's backward (its time is in the compute seconds, as the Trainer's);
  the deflation is the averaging algorithms';
* decentralized-sgd steps on this rank's own mean gradient (deflated by its own tokens or sentences) and then
  gossips the parameters with its neighbours (``after_step``); the recipe's clip applies to that own gradient.

An overflowing step (any rank's gradient non-finite) is skipped on every rank before the algorithm runs, so no
error-feedback memory or gossip takes in an infinite value.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mlbench_api.training import Algorithm
from mlbench_runner.algorithms.base import DistributedAlgorithm, trainable
from mlbench_runner.algorithms.loop_step import AVERAGING, registry_step
from mlbench_runner.comm import Communicator
from mlbench_runner.translation.optim import LossScaler, MicroBatch, StepOutcome, label_smoothed_loss

#: The algorithms whose step is the loop's fused all-reduce (centralized-adam: the recipe's Adam on the average).
FUSED = frozenset({Algorithm.ALLREDUCE_SGD.value, Algorithm.CENTRALIZED_ADAM.value})
#: The registry algorithms whose synchronized gradient is a mean over ranks (deflated by the ranks' totals).
MEAN_OVER_RANKS = AVERAGING | {Algorithm.DDP.value}


def accumulating(model: nn.Module, last: bool) -> contextlib.AbstractContextManager[object]:
    """DDP's ``no_sync()`` for every micro-batch but the step's last (one all-reduce per step), else nothing."""
    if isinstance(model, DistributedDataParallel) and not last:
        return model.no_sync()
    return contextlib.nullcontext()


def backward_all(
    model: nn.Module,
    micro_batches: Sequence[MicroBatch],
    scale: float,
    *,
    pad: int,
    smoothing: float,
    autocast: torch.dtype | None,
) -> tuple[float, int, int]:
    """Back-propagate every micro-batch's summed token loss times ``scale`` (DDP: synchronized in the last's
    backward only); the summed loss, tokens, sentences."""
    loss_sum, tokens, sentences = 0.0, 0, 0
    for i, mb in enumerate(micro_batches):
        device = mb.source.device
        context = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
        with accumulating(model, last=i == len(micro_batches) - 1):
            with context:
                logits = model(mb.source, mb.previous)
            loss = label_smoothed_loss(logits, mb.target, pad, smoothing)
            (loss * scale).backward()
        loss_sum += float(loss.detach())
        tokens += int(mb.target.ne(pad).sum())
        sentences += mb.target.shape[0]
    return loss_sum, tokens, sentences


def nonfinite(params: Sequence[nn.Parameter]) -> int:
    """How many gradient entries of ``params`` are inf or nan."""
    return sum(int((~torch.isfinite(p.grad)).sum()) for p in params if p.grad is not None)


def algorithm_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[MicroBatch],
    comm: Communicator,
    scaler: LossScaler,
    *,
    algorithm: DistributedAlgorithm,
    lr: float,
    pad: int,
    smoothing: float,
    autocast: torch.dtype | None = None,
    per_sentence: bool = False,
    clip_norm: float | None = None,
) -> StepOutcome:
    """One optimizer step of every rank through ``algorithm`` (prepared on ``model``); see the module doc."""
    started = time.perf_counter()
    params = trainable(model)
    device = params[0].device
    scale = scaler.scale  # the gradient's; update() below may change the scaler's
    loss_sum, tokens, sentences = backward_all(
        model, micro_batches, scale, pad=pad, smoothing=smoothing, autocast=autocast
    )
    stats = torch.tensor([loss_sum, tokens, sentences, nonfinite(params)], dtype=torch.float64, device=device)
    compute = time.perf_counter() - started
    comm_started = time.perf_counter()
    comm.all_reduce_sum_(stats)  # the step's statistics: the same totals and overflow decision on every rank
    communication = time.perf_counter() - comm_started
    started = time.perf_counter()
    total_loss, total_tokens, total_sentences, bad = (float(v) for v in stats.tolist())
    taken = scaler.update(bad > 0)
    collectives = 0.0
    if taken:
        denominator = _denominator(
            algorithm,
            scale=scale,
            per_sentence=per_sentence,
            mine=(tokens, sentences),
            totals=(total_tokens, total_sentences),
            world=comm.size,
        )
        collectives = registry_step(
            model, optimizer, algorithm, lr=lr, clip_norm=clip_norm, denominator=denominator, params=params
        )
    algorithm.zero_grad(model)
    compute += time.perf_counter() - started - collectives
    communication += collectives
    mean_loss = total_loss / max(total_tokens, 1.0)
    return StepOutcome(mean_loss, int(total_tokens), int(total_sentences), taken, compute, communication)


def _denominator(
    algorithm: DistributedAlgorithm,
    *,
    scale: float,
    per_sentence: bool,
    mine: tuple[int, int],
    totals: tuple[float, float],
    world: int,
) -> float:
    """What this rank divides its scaled gradient sum by (module doc)."""
    index = 1 if per_sentence else 0
    if algorithm.name in MEAN_OVER_RANKS:
        return scale * max(totals[index], 1.0) / world
    return scale * max(mine[index], 1)
