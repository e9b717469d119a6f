"""The registry algorithm's part of one optimizer step, for the task kinds that run their own loops (translation,
language modelling; the Trainer has its own in ``rank/steps.py``).

The loop back-propagates into the algorithm's gradient buffers; :func:`registry_step` then divides the gradient
by the loop's ``denominator`` (what turns this rank's gradient sum into the mean the algorithm should see),
synchronizes it through the algorithm, caps its global norm at ``clip_norm``, takes the optimizer's step at
``lr`` and runs the algorithm's ``after_step`` (gossip). :func:`counted_bytes` reads what the algorithm has handed
its counting communicator, so a loop can count the bytes of its steps (and not of its evaluations) against the
algorithm's :meth:`~.base.DistributedAlgorithm.plan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from mlbench_api.results import CommunicationRecord
from mlbench_api.training import Algorithm
from mlbench_runner.algorithms.base import CommunicationPlan, DistributedAlgorithm, trainable
from mlbench_runner.comm import CountingCommunicator
from mlbench_runner.timing import PhaseTimer

#: Registry algorithms that average a (compressed) gradient over ranks: their exact average would be the
#: all-reduce's. decentralized-sgd, the other kind, steps on the rank's own gradient and then gossips.
AVERAGING = frozenset({Algorithm.POWERSGD.value, Algorithm.SIGN_SGD.value, Algorithm.SPARSIFIED_SGD.value})


def registry_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    algorithm: DistributedAlgorithm,
    *,
    lr: float,
    clip_norm: float | None,
    denominator: float = 1.0,
    params: Sequence[nn.Parameter] | None = None,
) -> float:
    """Deflate, synchronize, clip, step, gossip (module doc); the seconds spent in the algorithm's collectives."""
    params = trainable(model) if params is None else params
    timer = PhaseTimer(torch.device("cpu"))  # wall clock around the collectives (a GPU run syncs on .tolist())
    timer.start_step(0)
    if denominator != 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.div_(denominator)
    algorithm.synchronize(model, timer)
    if clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, clip_norm)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    algorithm.after_step(model, timer)
    timer.end_step()
    return sum(t.phases.get("communication", 0.0) for t in timer.flush(wait=True))


def counted_bytes(algorithm: DistributedAlgorithm) -> int:
    """What the algorithm's communicator has counted so far (0 when it does not count, e.g. ddp's)."""
    comm = algorithm.comm
    return comm.bytes if isinstance(comm, CountingCommunicator) and algorithm.counted else 0


@dataclass
class StepBytes:
    """A registry algorithm's declared bytes per step and what its communicator counted in the steps (this
    rank); a loop adds ``counted_bytes`` after a step minus before it to ``sent``. ``counted`` False: the
    algorithm talks to the process group past the counter (ddp), nothing is measured."""

    plan: CommunicationPlan | None = None
    sent: int = 0
    counted: bool = True

    def record(self, steps: int) -> CommunicationRecord | None:
        """The declared bytes per step next to the counted ones (None without an algorithm)."""
        if self.plan is None:
            return None
        return self.plan.record(self.sent / steps if steps and self.counted else None)
