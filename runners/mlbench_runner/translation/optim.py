"""The translation tasks' training rule (4b's rate: :func:`mlbench_runner.schedule.warmup_inverse_sqrt`, 4a's:
:func:`exponential_warmup_step_decay`): label-smoothed loss, gradient accumulation over ``update_freq`` micro-batches
with one all-reduce per optimizer step, gradient clipping (4a), and the dynamic loss scaler of the public recipe
(mlbench-core's FP16Optimizer).

One optimizer step (:func:`accumulated_step`): every micro-batch's summed token loss, times the loss scale, is
back-propagated; the flat gradient and this rank's target-token count go through one all-reduce; the gradient is
deflated by ``scale * tokens of all ranks and micro-batches`` (4b: the page's "full batch size"; 4a divides by the
sentences instead, the per-sentence loss of the reference), so k ranks with accumulation take the step one rank takes
on the same global batch; a ``clip_norm`` then caps the deflated gradient's global norm. A non-finite gradient skips
the step and halves the scale; ``window`` clean steps in a row double it (up to ``max_scale``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mlbench_runner.comm import Communicator


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, pad: int, smoothing: float) -> torch.Tensor:
    """Summed label-smoothed cross-entropy over the non-pad target tokens (fp32 logits)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        target.reshape(-1),
        ignore_index=pad,
        label_smoothing=smoothing,
        reduction="sum",
    )


def update_freq(global_tokens: int, max_tokens: int, world_size: int) -> int:
    """The page's ``update_freq = max(1, b / (bs_max * world_size))``: micro-batches per optimizer step."""
    return max(1, global_tokens // (max_tokens * world_size))


def exponential_warmup_step_decay(
    step: int,
    total: int,
    *,
    peak: float,
    warmup: int,
    decay_start: float = 0.4,
    decay_interval: float = 0.05,
    max_decays: int = 4,
    factor: float = 0.5,
) -> float:
    """Task 4a's rate for 0-based optimizer ``step`` of ``total`` (mlbench-core's ExponentialWarmupMultiStepLR):
    ``peak * 0.01 ** ((warmup - step) / warmup)`` up to ``warmup`` (0.01 * peak at step 0, peak at ``warmup``);
    from ``int(decay_start * total)`` on, ``peak * factor ** k`` with k = 1 + (steps since then) //
    ``int(decay_interval * total)`` (at least 1), at most ``max_decays``; ``peak`` in between."""
    start = int(decay_start * total)
    interval = max(1, int(decay_interval * total))
    warmup = min(warmup, start)
    if step <= warmup:
        return peak * (math.exp(math.log(0.01) / warmup) ** (warmup - step) if warmup else 1.0)
    if step >= start:
        return peak * factor ** min((step - start) // interval + 1, max_decays)
    return peak


def sentence_batches(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Sentence indices sorted by length (ties by index) and cut into batches of ``size`` sentences (4a's batches
    count sentences; the last may be short)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [order[i : i + size] for i in range(0, len(order), size)]


@dataclass
class LossScaler:
    """The dynamic loss scale (4b: initial 2**7, factor 2, window 2000; 4a: initial 2**10, window 128, at most
    2**13); counts the skipped steps."""

    scale: float = 2.0**7
    factor: float = 2.0
    window: int = 2000
    max_scale: float = math.inf
    min_scale: float = 2.0**-14
    clean: int = 0  #: steps since the last overflow (or growth)
    skipped: int = 0  #: optimizer steps dropped for a non-finite gradient

    def update(self, overflow: bool) -> bool:
        """Record one step's outcome; True when the step is taken."""
        if overflow:
            self.scale = max(self.min_scale, self.scale / self.factor)
            self.clean = 0
            self.skipped += 1
            return False
        self.clean += 1
        if self.clean >= self.window:
            self.scale = min(self.max_scale, self.scale * self.factor)
            self.clean = 0
        return True


@dataclass(frozen=True)
class MicroBatch:
    source: torch.Tensor
    previous: torch.Tensor
    target: torch.Tensor


@dataclass(frozen=True)
class StepOutcome:
    loss: float  #: mean label-smoothed loss per target token over all ranks' micro-batches
    tokens: int  #: target tokens over all ranks and micro-batches
    sentences: int  #: sentence pairs over all ranks and micro-batches
    taken: bool  #: False when the loss scaler skipped the step
    compute_seconds: float
    communication_seconds: float


def accumulated_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[MicroBatch],
    comm: Communicator,
    scaler: LossScaler,
    *,
    lr: float,
    pad: int,
    smoothing: float,
    autocast: torch.dtype | None = None,
    per_sentence: bool = False,
    clip_norm: float | None = None,
) -> StepOutcome:
    """One optimizer step over this rank's ``micro_batches`` (all ranks call it together: one all-reduce). The
    gradient is the mean over all ranks' target tokens, or over their sentences when ``per_sentence``; its global
    norm is capped at ``clip_norm`` when given."""
    started = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    tokens, sentences = 0, 0
    for mb in micro_batches:
        context = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
        with context:
            logits = model(mb.source, mb.previous)
        loss = label_smoothed_loss(logits, mb.target, pad, smoothing)
        (loss * scaler.scale).backward()
        loss_sum += loss.detach().double()
        tokens += int(mb.target.ne(pad).sum())
        sentences += mb.target.shape[0]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    dtype = params[0].dtype  # fp32 master weights: the gradient is reduced and deflated in fp32
    counts = torch.tensor([float(loss_sum), tokens, sentences], dtype=dtype, device=device)
    flat = torch.cat([*(g.reshape(-1).to(dtype) for g in grads), counts])
    compute = time.perf_counter() - started
    comm_started = time.perf_counter()
    comm.all_reduce_sum_(flat)  # the one collective of the step
    communication = time.perf_counter() - comm_started
    started = time.perf_counter()
    total_sentences, total_tokens = int(flat[-1].item()), int(flat[-2].item())
    global_loss = float(flat[-3].item())
    flat = flat[:-3] / (scaler.scale * max(total_sentences if per_sentence else total_tokens, 1))
    overflow = not bool(torch.isfinite(flat).all())  # the same on every rank: the reduced gradient decides
    taken = scaler.update(overflow)
    if taken and clip_norm is not None:
        flat = clipped(flat, clip_norm)
    if taken:
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.dtype)
            offset += n
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    compute += time.perf_counter() - started
    mean_loss = global_loss / max(total_tokens, 1)
    return StepOutcome(mean_loss, total_tokens, total_sentences, taken, compute, communication)


def clipped(flat: torch.Tensor, max_norm: float) -> torch.Tensor:
    """``flat`` scaled down to global L2 norm ``max_norm`` when longer (torch's clip_grad_norm_ rule, eps 1e-6)."""
    norm = float(torch.linalg.vector_norm(flat))
    return flat * (max_norm / (norm + 1e-6)) if norm > max_norm else flat
