"""Decentralized (gossip) SGD, D-PSGD (Lian et al. 2017), as in the original MLBench core.

Every rank takes a local optimizer step on its own gradient (:meth:`DecentralizedSGD.synchronize`
does nothing), then :meth:`DecentralizedSGD.after_step` replaces its parameters by a weighted
average with its neighbours in the topology: x_r <- sum_j W[r, j] x_j. The mixing matrix W is
doubly stochastic (rows and columns sum to 1), so the mean of the parameters over ranks is what
the local steps made it, exactly up to rounding; only the spread between ranks shrinks.

* ``ring``: neighbours (r - 1) mod k and (r + 1) mod k, weight 1/3 each and 1/3 for itself. With
  two ranks both neighbours are the other rank: one exchange, weights 1/2 and 1/2. One rank: nothing.
* ``complete``: the exact average, one all-reduce of the parameters divided by k (every rank then
  holds the same model, as allreduce-sgd's ranks do, but it averages models, not gradients).

:func:`mixing_weights` is W's row for one rank; it is the whole gossip rule. Only parameters are
gossiped: the optimizer's state (momentum) stays each rank's own, as in MLBench core.

The parameters live in one flat buffer: :class:`FlatParameters` makes every trainable parameter's
``.data`` a view into it (with the parameter's own strides, so a channels-last weight stays
channels-last), the way :class:`~mlbench_runner.algorithms.base.FlatGradients` does for gradients.
The optimizer updates the views in place, and the gossip sends and rewrites the flat buffer with no
packing copy: one point-to-point exchange per step (``communication``), then the weighted sum,
a local kernel (``compression``).

Evaluation: the ranks hold different models. The run evaluates their consensus, the average model,
without disturbing training: :meth:`~DecentralizedSGD.before_evaluation` saves this rank's
parameters and replaces them by the exact all-reduced average (and averages the BatchNorm buffers
as every algorithm does; the running statistics do not feed training's forward, so they stay
averaged), :meth:`~DecentralizedSGD.after_evaluation` puts the saved parameters back, bit for bit.
With ``complete`` the ranks already agree, so only the buffers are averaged.

Debug knob ``MLBENCH_TRACE_GOSSIP=<dir>`` (small models only, it writes every number every step):
each rank appends one JSON line per step to ``<dir>/gossip-rank-<r>.jsonl`` with the parameters at
the step's start (``start``), after the local optimizer step (``local``) and after the gossip
(``mixed``), so tests can check the mixing itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from mlbench_api.parameters import Topology
from mlbench_runner.algorithms.base import (
    CommunicationPlan,
    DistributedAlgorithm,
    average_buffers,
    broadcast_state,
    parameter_bytes,
    register,
    trainable,
)
from mlbench_runner.options import TRACE_GOSSIP
from mlbench_runner.timing import PhaseTimer


def mixing_weights(topology: Topology | str, rank: int, size: int) -> dict[int, float]:
    """Row ``rank`` of the mixing matrix W for ``size`` ranks: {rank j: W[rank, j]}, itself included.

    Every entry is positive and the row sums to 1; W is symmetric, so its columns sum to 1 as well
    (doubly stochastic). The keys other than ``rank`` are the ranks this rank exchanges with.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in 0..{size - 1}")
    topology = Topology(topology)
    if topology is Topology.COMPLETE:
        return {j: 1.0 / size for j in range(size)}
    group = {rank, (rank - 1) % size, (rank + 1) % size}  # 1, 2 or 3 distinct ranks
    return {j: 1.0 / len(group) for j in sorted(group)}


def neighbours(topology: Topology | str, rank: int, size: int) -> list[int]:
    """The ranks ``rank`` receives from under ``topology`` (itself excluded), in rank order."""
    return [j for j in mixing_weights(topology, rank, size) if j != rank]


def _aliasing_view(flat: torch.Tensor, offset: int, p: torch.Tensor) -> torch.Tensor:
    """A view of ``flat[offset : offset + p.numel()]`` shaped like ``p``, with p's strides when p is dense."""
    segment = flat[offset : offset + p.numel()]
    dense = p.is_contiguous() or (p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last))
    return segment.as_strided(p.shape, p.stride()) if dense else segment.view(p.shape)


class FlatParameters:
    """Every trainable parameter's ``.data`` made a view into one flat buffer (values kept).

    The ``nn.Parameter`` objects stay the same (an optimizer built afterwards, or before, holds them),
    only their storage moves; in-place updates of the parameters are updates of ``flat`` and back.
    """

    def __init__(self, model: nn.Module, algorithm: str) -> None:
        params = trainable(model)
        if not params:
            raise ValueError(f"{algorithm} needs a model with trainable parameters")
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"{algorithm} needs one parameter dtype, found {sorted(map(str, dtypes))}")
        self.params = params
        self.flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        offset = 0
        with torch.no_grad():
            for p in params:
                view = _aliasing_view(self.flat, offset, p)
                view.copy_(p.data)
                p.data = view
                offset += p.numel()

    def aliased(self) -> bool:
        """Whether every parameter still lives in ``flat`` (an optimizer or ``.to()`` may have replaced it)."""
        start, end = self.flat.data_ptr(), self.flat.data_ptr() + self.flat.numel() * self.flat.element_size()
        return all(start <= p.data_ptr() < end for p in self.params)


@register("decentralized-sgd")
class DecentralizedSGD(DistributedAlgorithm):
    """D-PSGD: local step on the own gradient, then gossip averaging of parameters with the neighbours."""

    def _topology(self) -> Topology:
        return Topology(self.parameters.topology or Topology.RING)

    def prepare(self, model: nn.Module) -> nn.Module:
        broadcast_state(model, self.comm)
        self.params = FlatParameters(model, self.name)
        self.topology = self._topology()
        self.weights = mixing_weights(self.topology, self.comm.rank, self.comm.size)
        self.peers = [j for j in self.weights if j != self.comm.rank]
        self._saved: torch.Tensor | None = None
        trace: str | None = TRACE_GOSSIP.read()  # MLBENCH_TRACE_GOSSIP, declared in mlbench_runner.options
        self._trace = Path(trace) / f"gossip-rank-{self.comm.rank}.jsonl" if trace else None
        self._trace_step = 0
        self._trace_start: list[float] = []
        return model

    def synchronize(self, model: nn.Module, timer: PhaseTimer) -> None:
        # D-PSGD: the optimizer applies this rank's own gradient; nothing to agree on before it.
        if self._trace is not None:
            self._trace_start = self.params.flat.tolist()

    def after_step(self, model: nn.Module, timer: PhaseTimer) -> None:
        local = self.params.flat.tolist() if self._trace is not None else []
        self.gossip(timer)
        if self._trace is not None:
            line = {"step": self._trace_step, "start": self._trace_start, "local": local}
            line["mixed"] = self.params.flat.tolist()
            self._trace.parent.mkdir(parents=True, exist_ok=True)
            with self._trace.open("a") as f:
                f.write(json.dumps(line) + "\n")
            self._trace_step += 1

    def gossip(self, timer: PhaseTimer) -> None:
        """x <- sum_j W[r, j] x_j over this rank and its neighbours (nothing for one rank)."""
        if self.comm.size == 1:
            return
        flat = self.params.flat
        if self.topology is Topology.COMPLETE:
            with timer.phase("communication"):
                self.comm.all_reduce_sum_(flat)
            with timer.phase("compression"):
                flat.div_(self.comm.size)
            return
        with timer.phase("communication"):
            received = self.comm.exchange(flat, self.peers)
        with timer.phase("compression"):
            flat.mul_(self.weights[self.comm.rank])
            for peer, tensor in zip(self.peers, received, strict=True):
                flat.add_(tensor, alpha=self.weights[peer])

    def plan(self, model: nn.Module) -> CommunicationPlan:
        size = parameter_bytes(model)
        k = self.comm.size
        if k == 1:
            return CommunicationPlan((), 0, size)
        if self._topology() is Topology.COMPLETE:
            return CommunicationPlan(("all-reduce",), size, size)
        return CommunicationPlan(("send-recv",), size * len(neighbours(Topology.RING, self.comm.rank, k)), size)

    def before_evaluation(self, model: nn.Module) -> None:
        """Evaluate the consensus: this rank's parameters saved, replaced by the average over ranks."""
        average_buffers(model, self.comm)
        if self.comm.size == 1 or self.topology is Topology.COMPLETE:
            return  # the ranks already hold the same parameters
        self._saved = self.params.flat.clone()
        self.comm.all_reduce_sum_(self.params.flat)
        self.params.flat.div_(self.comm.size)

    def after_evaluation(self, model: nn.Module) -> None:
        """Put back this rank's own parameters, so training goes on from where its gossip left it."""
        if self._saved is not None:
            self.params.flat.copy_(self._saved)
            self._saved = None
