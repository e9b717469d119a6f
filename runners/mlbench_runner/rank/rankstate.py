"""One rank's training state for a checkpoint, and putting it back: model, optimizer (torch.optim's, or the
fast step's flat momentum buffer), the algorithm's own state (error feedback, RNGs), the augmentation generator,
torch's RNGs, and the rank's timing totals. Only tensors, numbers and strings: ``torch.load(weights_only=True)``
reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mlbench_runner.algorithms import DistributedAlgorithm
from mlbench_runner.rank.steps import Step
from mlbench_runner.rank.summary import SummaryBuilder


def _optimizer_state(step: Step) -> dict[str, Any]:
    optimizer = getattr(step, "optimizer", None)
    if isinstance(optimizer, torch.optim.Optimizer):
        return {"torch": optimizer.state_dict()}
    buffer = getattr(getattr(step, "sgd", None), "buffer", None)
    return {"flatMomentum": buffer} if buffer is not None else {}


def _load_optimizer(step: Step, state: dict[str, Any]) -> None:
    optimizer = getattr(step, "optimizer", None)
    if isinstance(optimizer, torch.optim.Optimizer):
        if "torch" not in state:
            raise ValueError("the checkpoint's optimizer state is of another training step")
        optimizer.load_state_dict(state["torch"])
        return
    buffer = getattr(getattr(step, "sgd", None), "buffer", None)
    if buffer is not None:
        if "flatMomentum" not in state:
            raise ValueError("the checkpoint's optimizer state is of another training step")
        buffer.copy_(state["flatMomentum"])


@dataclass(frozen=True)
class Parts:
    """What holds a rank's state: the trainer's set-up, seen by what a checkpoint needs of it."""

    model: nn.Module
    step: Step
    algorithm: DistributedAlgorithm
    generator: torch.Generator | None  #: the augmentation's (image tasks), else None
    summary: SummaryBuilder
    device: torch.device


def capture(parts: Parts) -> dict[str, Any]:
    """This rank's state after an epoch's evaluation."""
    model, step, algorithm, generator, summary, device = (
        parts.model,
        parts.step,
        parts.algorithm,
        parts.generator,
        parts.summary,
        parts.device,
    )
    rng: dict[str, Any] = {"torch": torch.get_rng_state()}
    if generator is not None:
        rng["kernel"] = generator.get_state()
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": _optimizer_state(step),
        "algorithm": algorithm.state(),
        "rng": rng,
        "timing": {"totals": dict(summary.totals), "evaluation": summary.evaluation, "stepsTimed": summary.steps_timed},
    }


def restore(state: dict[str, Any], parts: Parts) -> None:
    """Put back what :func:`capture` took (the model's tensors in place: flat views stay views)."""
    model, step, algorithm, generator, summary, device = (
        parts.model,
        parts.step,
        parts.algorithm,
        parts.generator,
        parts.summary,
        parts.device,
    )
    with torch.no_grad():
        model.load_state_dict(state["model"])
    _load_optimizer(step, state["optimizer"])
    algorithm.load_state(state["algorithm"])
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    if generator is not None and "kernel" in rng:
        generator.set_state(rng["kernel"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)
    timing = state["timing"]
    summary.totals.update(timing["totals"])
    summary.evaluation = float(timing["evaluation"])
    summary.steps_timed = int(timing["stepsTimed"])
