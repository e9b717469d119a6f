"""The all-reduce family: the reference (allreduce-sgd), DDP as a baseline, and Centralized Adam."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mlbench_api.config import RunConfig
from mlbench_runner.algorithms.base import (
    CommunicationPlan,
    DistributedAlgorithm,
    FlatGradients,
    broadcast_state,
    parameter_bytes,
    register,
)
from mlbench_runner.comm import TorchCommunicator
from mlbench_runner.timing import PhaseTimer


def all_reduce_plan(algorithm: DistributedAlgorithm, model: nn.Module) -> CommunicationPlan:
    """One all-reduce of every gradient per step, unless the rank is alone (a process group of one rank,
    ``MLBENCH_PROCESS_GROUP=1``, all-reduces too)."""
    size = parameter_bytes(model)
    sent = not algorithm.comm.alone()
    return CommunicationPlan(("all-reduce",) if sent else (), size if sent else 0, size)


@register("allreduce-sgd")
class AllReduceSGD(DistributedAlgorithm):
    """The reference: all-reduce the gradients after every mini-batch, divide by k.

    ``by-model`` makes every ``.grad`` a view into one flat buffer, so the whole model is a
    single all-reduce with no packing copy; ``by-layer`` issues one all-reduce per tensor.
    """

    def prepare(self, model: nn.Module) -> nn.Module:
        broadcast_state(model, self.comm)
        self.grads = FlatGradients(model, self.name)
        return model

    def zero_grad(self, model: nn.Module) -> None:
        self.grads.flat.zero_()

    def synchronize(self, model: nn.Module, timer: PhaseTimer) -> None:
        if self.comm.alone():
            return
        with timer.phase("communication"):
            if self.bucketing == "by-layer":
                for view in self.grads.views:
                    self.comm.all_reduce_sum_(view)
            else:
                self.comm.all_reduce_sum_(self.grads.flat)
        with timer.phase("compression"):  # the average is a local kernel: compute, not communication
            self.grads.flat.div_(self.comm.size)

    def plan(self, model: nn.Module) -> CommunicationPlan:
        return all_reduce_plan(self, model)


@register("centralized-adam")
class CentralizedAdam(AllReduceSGD):
    """Averaged gradients (the reference's all-reduce), then Adam on every rank (the contributor report's
    Centralized Adam). Identical gradients and identical Adam state keep the ranks' models identical.

    The task's learning-rate schedule and weight decay apply; momentum and nesterov do not (Adam's betas
    are torch's defaults, 0.9 and 0.999).
    """

    def make_optimizer(self, config: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
        tr = config.task.training
        return torch.optim.Adam(model.parameters(), lr=config.lr.initial_lr, weight_decay=tr.weight_decay)


def has_moving_buffers(model: nn.Module) -> bool:
    """Whether DDP must broadcast rank 0's buffers before each forward: only buffers that change in training
    (BatchNorm's running statistics) need it; a constant one (the Transformer's positional table) would cost one
    uncounted broadcast per micro-batch for nothing."""
    return any(getattr(m, "track_running_stats", False) for m in model.modules())


@register("ddp")
class DDPBaseline(DistributedAlgorithm):
    """torch DistributedDataParallel: bucketed all-reduce overlapped with backward.

    Its communication cannot be separated from backward, so ``synchronize`` is empty and
    the backward phase includes the (overlapped) all-reduce time.
    """

    def prepare(self, model: nn.Module) -> nn.Module:
        if not isinstance(self.comm.transport(), TorchCommunicator):
            raise ValueError("algorithm: ddp needs backend gloo or nccl (torch.distributed), not mpi")
        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=has_moving_buffers(model))

    counted = False  # DDP's reducer calls the process group itself, past the counting communicator

    def synchronize(self, model: nn.Module, timer: PhaseTimer) -> None:
        return None

    def plan(self, model: nn.Module) -> CommunicationPlan:
        return all_reduce_plan(self, model)  # every gradient once per step, as the reference does

    # before_evaluation: the base class's average. DDP broadcasts rank 0's buffers at the
    # start of each forward, but BatchNorm then updates them from the rank's own batch, so
    # after the last training step the ranks' running statistics differ.
