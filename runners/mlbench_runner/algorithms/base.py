"""The contract every distributed algorithm implements, and the registry that names them.

An algorithm owns everything between "local gradients exist" and "the next step may begin":

* :meth:`DistributedAlgorithm.synchronize` runs between backward and the optimizer step;
* :meth:`DistributedAlgorithm.after_step` runs after the optimizer step (gossip averaging);
* both open the timer's phases themselves: collectives inside ``communication``, extra
  kernels (compression, decompression, error feedback) inside ``compression``, which the
  summary counts as compute. So ``communicationSeconds`` is only time spent in collectives
  (waiting for the slowest rank included), whatever the algorithm.

Each algorithm also declares what it sends (:meth:`DistributedAlgorithm.plan`); the trainer
counts the payload bytes really handed to the communicator and records both in the result.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mlbench_api.config import RunConfig
from mlbench_api.parameters import AlgorithmParameters
from mlbench_api.results import CommunicationRecord
from mlbench_api.training import Optimizer
from mlbench_runner.comm import Communicator
from mlbench_runner.flat import dense_view
from mlbench_runner.timing import PhaseTimer


@dataclass(frozen=True)
class CommunicationPlan:
    """What one rank sends per optimizer step: the collectives used and their payload bytes."""

    collectives: tuple[str, ...]
    bytes_per_step: int
    uncompressed_bytes_per_step: int

    def record(self, measured_bytes_per_step: float | None) -> CommunicationRecord:
        ratio = self.uncompressed_bytes_per_step / self.bytes_per_step if self.bytes_per_step else None
        return CommunicationRecord(
            collectives=list(self.collectives),
            bytes_per_step=self.bytes_per_step,
            measured_bytes_per_step=measured_bytes_per_step,
            uncompressed_bytes_per_step=self.uncompressed_bytes_per_step,
            compression_ratio=ratio,
        )


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def parameter_bytes(model: nn.Module) -> int:
    """What allreduce-sgd sends per step: every trainable parameter once."""
    return sum(p.numel() * p.element_size() for p in trainable(model))


def default_optimizer(config: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The task's optimizer (sgd with its momentum and nesterov, or adam) at the schedule's initial rate."""
    tr = config.task.training
    if tr.optimizer is Optimizer.ADAM:
        return torch.optim.Adam(model.parameters(), lr=config.lr.initial_lr, weight_decay=tr.weight_decay)
    return torch.optim.SGD(
        model.parameters(),
        lr=config.lr.initial_lr,
        momentum=tr.momentum,
        nesterov=tr.nesterov,
        weight_decay=tr.weight_decay,
    )


class DistributedAlgorithm(ABC):
    """How gradients (and model state) are kept in agreement across ranks."""

    name: str = ""
    #: Whether its collectives go through ``self.comm`` (so the trainer's byte count is a measurement).
    counted: bool = True

    def __init__(
        self,
        comm: Communicator,
        bucketing: str = "by-model",
        parameters: AlgorithmParameters | None = None,
        seed: int = 0,
    ) -> None:
        self.comm = comm
        self.bucketing = bucketing
        self.parameters = parameters or AlgorithmParameters()
        self.seed = seed

    @abstractmethod
    def prepare(self, model: nn.Module) -> nn.Module:
        """Make every rank start from rank 0's model; return the module to train."""

    @abstractmethod
    def synchronize(self, model: nn.Module, timer: PhaseTimer) -> None:
        """Between backward and the optimizer step: make the gradients what the optimizer should apply."""

    @abstractmethod
    def plan(self, model: nn.Module) -> CommunicationPlan:
        """The collectives and payload bytes of one step (``model`` as returned by :meth:`prepare`)."""

    def after_step(self, model: nn.Module, timer: PhaseTimer) -> None:  # noqa: B027 - optional hook
        """After the optimizer step (decentralized algorithms average parameters here)."""

    def make_optimizer(self, config: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
        """The optimizer applied to the synchronized gradients; the task's unless the algorithm fixes one."""
        return default_optimizer(config, model)

    def zero_grad(self, model: nn.Module) -> None:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()

    def before_evaluation(self, model: nn.Module) -> None:
        """Make non-parameter state (BatchNorm statistics) identical so ranks evaluate one model."""
        average_buffers(model, self.comm)

    def after_evaluation(self, model: nn.Module) -> None:  # noqa: B027 - optional hook
        """Undo what :meth:`before_evaluation` changed that training must not see (default: nothing)."""

    def state(self) -> dict[str, Any]:
        """This rank's state beyond the model and optimizer (error feedback, RNGs, step counters) for a
        checkpoint: tensors, numbers and strings only (what ``torch.load(weights_only=True)`` reads back)."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what :meth:`state` returned (after :meth:`prepare`)."""


def average_buffers(model: nn.Module, comm: Communicator) -> None:
    """Replace every floating-point buffer by its mean over ranks (one flat all-reduce)."""
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    if not buffers or comm.alone():
        return
    flat = torch.cat([b.reshape(-1) for b in buffers])
    comm.all_reduce_sum_(flat)
    flat /= comm.size
    offset = 0
    for b in buffers:
        b.copy_(flat[offset : offset + b.numel()].view_as(b))
        offset += b.numel()


def broadcast_state(model: nn.Module, comm: Communicator) -> None:
    """Copy rank 0's parameters and buffers to every rank (one flat broadcast per dtype)."""
    if comm.alone():
        return
    tensors = [t for t in list(model.parameters()) + list(model.buffers())]
    for dtype in sorted({t.dtype for t in tensors}, key=str):  # same order on every rank
        group = [t for t in tensors if t.dtype == dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        comm.broadcast_(flat, 0)
        offset = 0
        with torch.no_grad():
            for t in group:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


class FlatGradients:
    """Every ``.grad`` of the model made a view into one flat buffer, so the whole gradient is one tensor.

    Backward accumulates in place into the views; an algorithm then reads or rewrites ``flat`` without a
    packing copy.
    """

    def __init__(self, model: nn.Module, algorithm: str) -> None:
        params = trainable(model)
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"{algorithm} needs one parameter dtype, found {sorted(map(str, dtypes))}")
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            p.grad = dense_view(self.flat, offset, p)  # laid out like p (channels_last stays channels_last)
            self.views.append(self.flat[offset : offset + p.numel()])
            offset += p.numel()


def ceil_fraction(n: int, fraction: float) -> int:
    """``ceil(fraction * n)``, at least 1 and at most n."""
    return max(1, min(n, math.ceil(fraction * n)))


_REGISTRY: dict[str, type[DistributedAlgorithm]] = {}


def register(name: str) -> Callable[[type[DistributedAlgorithm]], type[DistributedAlgorithm]]:
    """Class decorator: make an algorithm available under ``name`` (an ``Algorithm`` value)."""

    def add(cls: type[DistributedAlgorithm]) -> type[DistributedAlgorithm]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def registered() -> list[str]:
    return sorted(_REGISTRY)


def make_algorithm(
    name: str,
    comm: Communicator,
    bucketing: str = "by-model",
    parameters: AlgorithmParameters | None = None,
    seed: int = 0,
) -> DistributedAlgorithm:
    if name not in _REGISTRY:
        raise ValueError(f"algorithm: unknown {name!r} (known: {', '.join(registered())})")
    return _REGISTRY[name](comm, bucketing, parameters, seed)
