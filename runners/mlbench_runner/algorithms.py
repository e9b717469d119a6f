"""Distributed training algorithms, looked up by name (``RunConfig.algorithm``).

An algorithm owns everything between "local gradients exist" and "the optimizer may
step": ``synchronize`` is exactly the communication phase that the timer measures. New
algorithms (PowerSGD, local SGD, ...) register a factory with :func:`register`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn

from mlbench_runner.comm import Communicator, TorchCommunicator


class DistributedAlgorithm(ABC):
    """How gradients (and model state) are kept in agreement across ranks."""

    name: str = ""

    def __init__(self, comm: Communicator, bucketing: str) -> None:
        self.comm = comm
        self.bucketing = bucketing

    @abstractmethod
    def prepare(self, model: nn.Module) -> nn.Module:
        """Make every rank start from rank 0's model; return the module to train."""

    @abstractmethod
    def synchronize(self, model: nn.Module) -> None:
        """Turn local gradients into the global average (the communication phase)."""

    def zero_grad(self, model: nn.Module) -> None:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()

    def before_evaluation(self, model: nn.Module) -> None:
        """Make non-parameter state (BatchNorm statistics) identical so ranks evaluate one model."""
        buffers = [b for b in model.buffers() if b.is_floating_point()]
        if not buffers or self.comm.size == 1:
            return
        flat = torch.cat([b.reshape(-1) for b in buffers])
        self.comm.all_reduce_sum_(flat)
        flat /= self.comm.size
        offset = 0
        for b in buffers:
            b.copy_(flat[offset : offset + b.numel()].view_as(b))
            offset += b.numel()


_REGISTRY: dict[str, Callable[[Communicator, str], DistributedAlgorithm]] = {}


def register(name: str) -> Callable[[type[DistributedAlgorithm]], type[DistributedAlgorithm]]:
    """Class decorator: make an algorithm available under ``name``."""

    def add(cls: type[DistributedAlgorithm]) -> type[DistributedAlgorithm]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def make_algorithm(name: str, comm: Communicator, bucketing: str = "by-model") -> DistributedAlgorithm:
    if name not in _REGISTRY:
        raise ValueError(f"algorithm: unknown {name!r} (known: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name](comm, bucketing)


def broadcast_state(model: nn.Module, comm: Communicator) -> None:
    """Copy rank 0's parameters and buffers to every rank (one flat broadcast per dtype)."""
    if comm.size == 1:
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


@register("allreduce-sgd")
class AllReduceSGD(DistributedAlgorithm):
    """The reference: all-reduce the gradients after every mini-batch, divide by k.

    ``by-model`` makes every ``.grad`` a view into one flat buffer, so the whole model is a
    single all-reduce with no packing copy; ``by-layer`` issues one all-reduce per tensor.
    """

    def prepare(self, model: nn.Module) -> nn.Module:
        broadcast_state(model, self.comm)
        params = [p for p in model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"allreduce-sgd needs one parameter dtype, found {sorted(map(str, dtypes))}")
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)  # backward accumulates in place
            self.views.append(self.flat[offset : offset + p.numel()])
            offset += p.numel()
        return model

    def zero_grad(self, model: nn.Module) -> None:
        self.flat.zero_()

    def synchronize(self, model: nn.Module) -> None:
        if self.comm.size == 1:
            return
        if self.bucketing == "by-layer":
            for view in self.views:
                self.comm.all_reduce_sum_(view)
        else:
            self.comm.all_reduce_sum_(self.flat)
        self.flat.div_(self.comm.size)


@register("ddp")
class DDPBaseline(DistributedAlgorithm):
    """torch DistributedDataParallel: bucketed all-reduce overlapped with backward.

    Its communication cannot be separated from backward, so ``synchronize`` is empty and
    the backward phase includes the (overlapped) all-reduce time.
    """

    def prepare(self, model: nn.Module) -> nn.Module:
        if not isinstance(self.comm, TorchCommunicator):
            raise ValueError("algorithm: ddp needs backend gloo or nccl (torch.distributed), not mpi")
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=True)

    def synchronize(self, model: nn.Module) -> None:
        return None

    # before_evaluation: the base class's average. DDP broadcasts rank 0's buffers at the
    # start of each forward, but BatchNorm then updates them from the rank's own batch, so
    # after the last training step the ranks' running statistics differ.
