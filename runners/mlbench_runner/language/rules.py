"""Task 3a's rules as pure functions: the BPTT window lengths, the rate per batch, the warm-up over workers, the
switch to averaged SGD, activation regularisation, and the running parameter average."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

import torch


def sequence_lengths(
    tokens: int,
    bptt: int,
    rng: random.Random | None,
    *,
    short_probability: float = 0.05,
    std: float = 5.0,
    min_length: int = 5,
) -> list[int]:
    """The BPTT windows that cover a stream of ``tokens`` time steps (each predicts the next, so ``tokens - 1``
    targets). The page's rule: X ~ Bernoulli(short_probability), length = max(min_length, Normal(bptt / (1 + X),
    std)), truncated to an integer as the reference does; the last window is cut to what is left. ``rng`` None:
    fixed windows of ``bptt`` (evaluation). Every rank draws from the same seed, so all take the same steps."""
    lengths: list[int] = []
    start = 0
    while start < tokens - 1:
        length = bptt
        if rng is not None:
            mean = bptt / 2.0 if rng.random() < short_probability else float(bptt)
            length = max(min_length, int(rng.gauss(mean, std)))
        length = min(length, tokens - 1 - start)
        lengths.append(length)
        start += length
    return lengths


def batch_rate(rate: float, length: int, bptt: int) -> float:
    """The page's rate per batch: eta * seq_len / bptt_len (a short window takes a smaller step)."""
    return rate * length / bptt


def warmed_rate(rate: float, world: int, epochs_done: float, epochs_per_worker: float = 3.0) -> float:
    """The page's scaling: eta rises linearly to eta * sqrt(world) over world * epochs_per_worker epochs."""
    peak = rate * math.sqrt(world)
    period = world * epochs_per_worker
    if world <= 1 or period <= 0 or epochs_done >= period:
        return peak
    return rate + (peak - rate) * epochs_done / period


def switch_to_averaging(previous: Sequence[float], current: float, nonmono: int) -> bool:
    """NT-ASGD's trigger (Merity et al. 2017, as the reference code checks it after each evaluation): more than
    ``nonmono`` earlier evaluations, and the current validation loss worse than the best of all but the last
    ``nonmono`` of them: no improvement over ``nonmono`` epochs."""
    return len(previous) > nonmono and current > min(previous[:-nonmono])


def activation_regularization(dropped: torch.Tensor, alpha: float) -> torch.Tensor:
    """AR: alpha * mean(h^2) of the last layer's outputs after dropout."""
    return alpha * dropped.pow(2).mean()


def temporal_activation_regularization(raw: torch.Tensor, beta: float) -> torch.Tensor:
    """TAR: beta * mean((h_t - h_{t-1})^2) of the last layer's outputs before dropout, along time (dim 0)."""
    return beta * (raw[1:] - raw[:-1]).pow(2).mean()


class ParameterAverage:
    """The average of the parameters over every optimizer step since :meth:`start` (ASGD with t0 = 0, lambda = 0:
    the reference's torch.optim.ASGD); :meth:`swapped_in` puts the average into the model for evaluation."""

    def __init__(self) -> None:
        self.average: list[torch.Tensor] | None = None
        self.count = 0

    @property
    def active(self) -> bool:
        return self.average is not None

    def start(self, params: Iterable[torch.Tensor]) -> None:
        self.average = [p.detach().clone() for p in params]
        self.count = 1

    def update(self, params: Iterable[torch.Tensor]) -> None:
        if self.average is None:
            return
        self.count += 1
        for avg, p in zip(self.average, params, strict=True):
            avg.add_(p.detach() - avg, alpha=1.0 / self.count)

    def swap(self, params: Sequence[torch.Tensor]) -> None:
        """Exchange the model's values and the average's (twice restores both)."""
        if self.average is None:
            return
        with torch.no_grad():
            for avg, p in zip(self.average, params, strict=True):
                held = p.detach().clone()
                p.copy_(avg)
                avg.copy_(held)
