"""Gradient compression: sign SGD with majority vote, and sparsified SGD with error-feedback memory.

Both keep every rank's model identical (every rank computes the same update from the same collective
result) and hand the task's optimizer a dense gradient, as in the original MLBench core. The kernels
that compress and decompress (sign, top-k, random-k, packing, scatter, error feedback) run inside the
timer's ``compression`` phase; only the collectives are ``communication``.

The selection and error-feedback step (:func:`sparsify`) and the vote (:func:`sign_votes`,
:func:`majority_vote`) are pure functions, so their invariants can be tested without a process group.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from mlbench_api.parameters import Selection
from mlbench_api.training import Algorithm
from mlbench_runner.algorithms.base import (
    CommunicationPlan,
    DistributedAlgorithm,
    FlatGradients,
    broadcast_state,
    ceil_fraction,
    parameter_bytes,
    register,
    trainable,
)
from mlbench_runner.comm import Communicator, MpiCommunicator
from mlbench_runner.timing import PhaseTimer

#: The largest world whose int8 sign sum cannot overflow (127 votes of +1).
INT8_MAX_RANKS = 127
#: float16 represents every integer of magnitude up to 2^11 exactly (an 11-bit significand).
FLOAT16_EXACT_INTEGERS = 2048
#: Bytes of one index of sparsified SGD's top-k payload (int32: at most 2^31 - 1 parameters).
INDEX_BYTES = 4


# -- sign SGD -------------------------------------------------------------------------------------------


def vote_dtype(world_size: int, comm: Communicator) -> torch.dtype:
    """The type the signs are summed in: the narrowest whose sum cannot overflow with this transport.

    * up to 127 ranks: int8 (1 byte per parameter);
    * mpi4py (OpenMPI sums int16): int16 up to 32767 ranks;
    * torch.distributed: gloo refuses int16 ("Invalid scalar type") and NCCL has none, but both sum float16,
      which holds every integer up to 2048 exactly, and no partial sum of W votes exceeds W: float16 up to
      2048 ranks;
    * beyond: int32.
    """
    if world_size <= INT8_MAX_RANKS:
        return torch.int8
    if isinstance(comm.transport(), MpiCommunicator):
        return torch.int16 if world_size <= torch.iinfo(torch.int16).max else torch.int32
    if world_size <= FLOAT16_EXACT_INTEGERS:
        return torch.float16
    return torch.int32


def sign_votes(grad: torch.Tensor, dtype: torch.dtype = torch.int8) -> torch.Tensor:
    """One rank's ballot: +1, -1, or 0 (a zero gradient entry abstains), as ``dtype``."""
    return torch.sign(grad).to(dtype)


def majority_vote(votes_sum: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The update direction from the summed ballots: the majority's sign, 0 on a tie."""
    return torch.sign(votes_sum).to(dtype)


@register("sign-sgd")
class SignSGD(DistributedAlgorithm):
    """Sign SGD with majority vote (Bernstein, Zhao, Azizzadenesheli, Anandkumar, ICLR 2019).

    Each rank sends the sign of its gradient, one int8 per parameter (2 bytes from 128 ranks, 4 past 2048 with
    gloo or nccl: :func:`vote_dtype`), in one sum all-reduce; the update direction is the sign of the sum (0 on a
    tie), written back into the flat gradient on every rank. The task's optimizer then applies it with the
    schedule's learning rate: plain SGD gives signSGD with majority vote; with momentum it is Signum-like, but
    the momentum runs over the *voted* signs on every rank, whereas the paper's Signum votes on the sign of each
    worker's own momentum. Weight decay, if the task has it, is added by the optimizer after the vote (it is not
    compressed).

    One rank sends nothing but still takes the sign (signSGD), so the update rule is the same at every
    world size; its plan declares no collective and 0 bytes.
    """

    def prepare(self, model: nn.Module) -> nn.Module:
        broadcast_state(model, self.comm)
        self.grads = FlatGradients(model, self.name)
        self.vote_dtype = vote_dtype(self.comm.size, self.comm)
        return model

    def zero_grad(self, model: nn.Module) -> None:
        self.grads.flat.zero_()

    def synchronize(self, model: nn.Module, timer: PhaseTimer) -> None:
        flat = self.grads.flat
        if self.comm.size == 1:
            with timer.phase("compression"):
                flat.sign_()
            return
        with timer.phase("compression"):
            votes = sign_votes(flat, self.vote_dtype)
        with timer.phase("communication"):
            self.comm.all_reduce_sum_(votes)
        with timer.phase("compression"):
            flat.copy_(majority_vote(votes, flat.dtype))

    def plan(self, model: nn.Module) -> CommunicationPlan:
        size = parameter_bytes(model)
        if self.comm.size == 1:
            return CommunicationPlan((), 0, size)
        n = sum(p.numel() for p in trainable(model))
        element = torch.empty((), dtype=vote_dtype(self.comm.size, self.comm)).element_size()
        return CommunicationPlan(("all-reduce",), n * element, size)


# -- sparsified SGD -------------------------------------------------------------------------------------


class Sparsified(NamedTuple):
    """What one rank sends (``values`` at ``indices``) and the error memory it keeps."""

    values: torch.Tensor  #: acc[indices], acc's dtype
    indices: torch.Tensor  #: int64, distinct
    memory: torch.Tensor  #: acc with the sent entries zeroed: acc == memory + scatter(values, indices)


def random_indices(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """k distinct indices of ``range(n)``, uniformly at random, sorted; a function of the generator's state only.

    For small k it draws about 1.25 k with replacement and keeps a random k of the distinct ones (uniform by
    symmetry) instead of permuting all n, so the cost is O(k log k) rather than O(n).
    """
    if k * 8 > n:
        return torch.randperm(n, generator=generator)[:k].sort().values
    while True:
        drawn = torch.randint(n, (k + k // 4 + 16,), generator=generator).unique()
        if drawn.numel() >= k:
            return drawn[torch.randperm(drawn.numel(), generator=generator)[:k]].sort().values


def sparsify(
    acc: torch.Tensor,
    k: int,
    selection: Selection | str = Selection.TOP_K,
    generator: torch.Generator | None = None,
) -> Sparsified:
    """Select k entries of the 1-D accumulator ``acc`` (error memory + gradient) and keep the rest as memory.

    top-k: the k largest ``|acc|``. random-k: :func:`random_indices` from ``generator`` (seed it alike on every
    rank so they choose the same indices). Pure: ``acc`` is not modified. The result satisfies, exactly,
    ``memory + zeros.index_put(indices, values) == acc``.
    """
    if acc.dim() != 1:
        raise ValueError(f"sparsify: acc must be 1-D, got shape {tuple(acc.shape)}")
    if not 1 <= k <= acc.numel():
        raise ValueError(f"sparsify: k={k} outside 1..{acc.numel()}")
    if Selection(selection) is Selection.TOP_K:
        indices = torch.topk(acc.abs(), k, sorted=False).indices
    else:
        if generator is None:
            raise ValueError("sparsify: random-k needs a generator seeded alike on every rank")
        indices = random_indices(acc.numel(), k, generator).to(acc.device)
    return Sparsified(acc[indices], indices, acc.index_fill(0, indices, 0))


def random_k_seed(seed: int, step: int) -> int:
    """The seed of step ``step``'s random-k draw: the same on every rank, a different stream every step.

    torch's CPU generator (mt19937) keeps only the low 32 bits of its seed, so (seed, step) is mixed into 32
    bits: for a given seed, odd multipliers make every step below 2^32 a different seed.
    """
    return (seed * 0x9E3779B1 + step * 0x85EBCA77 + 1) & 0xFFFFFFFF


@register("sparsified-sgd")
class SparsifiedSGD(DistributedAlgorithm):
    """Sparsified SGD with memory (Stich, Cordonnier, Jaggi, NeurIPS 2018), top-k or random-k.

    Per step each rank forms ``acc = memory + grad`` over the whole model (one flat vector of n numbers),
    sends k = ceil(density x n) entries of it, and keeps the rest as its new memory (error feedback:
    nothing is lost, it is sent later). The flat gradient becomes the average over ranks of the sent sparse
    vectors, identical on every rank, and the task's optimizer applies it.

    * ``top-k``: each rank its own k largest ``|acc|``; values (the gradient's dtype) and int32 indices are
      packed into one byte buffer and all-gathered; every rank scatter-adds every rank's entries, rank by
      rank (so the sums are in the same order everywhere), divided by the world size.
    * ``random-k``: the k indices come from a generator seeded with (seed, step), identical on every rank,
      so only the k values travel, in one sum all-reduce.

    Memory is kept in gradient units (the paper accumulates learning rate x gradient): with a schedule that
    changes the rate, entries held back are applied at the rate of the step that sends them. Momentum and
    weight decay, if the task has them, are applied by the optimizer to the dense averaged gradient.

    One rank still compresses and keeps memory (only k coordinates move per step, as with more ranks), so a
    1-rank run measures the same algorithm; it sends nothing and its plan declares no collective and 0 bytes.
    """

    def prepare(self, model: nn.Module) -> nn.Module:
        broadcast_state(model, self.comm)
        self.grads = FlatGradients(model, self.name)
        params = self.parameters.for_algorithm(Algorithm.SPARSIFIED_SGD)
        self.density = params.density if params.density is not None else 0.01
        self.selection = Selection(params.selection or Selection.TOP_K)
        n = self.grads.flat.numel()
        if n > torch.iinfo(torch.int32).max:
            raise ValueError(f"sparsified-sgd: {n} parameters do not fit its int32 indices")
        self.k = ceil_fraction(n, self.density)
        self.memory = torch.zeros_like(self.grads.flat)
        self.generator = torch.Generator()  # CPU: the same stream on every rank and device
        self.step = 0
        return model

    def zero_grad(self, model: nn.Module) -> None:
        self.grads.flat.zero_()

    def synchronize(self, model: nn.Module, timer: PhaseTimer) -> None:
        with timer.phase("compression"):
            acc = self.memory + self.grads.flat
            if self.selection is Selection.RANDOM_K:
                self.generator.manual_seed(random_k_seed(self.seed, self.step))
            sent = sparsify(acc, self.k, self.selection, self.generator)
            self.memory = sent.memory
            self.step += 1
        if self.selection is Selection.TOP_K:
            self._exchange_top_k(sent, timer)
        else:
            self._exchange_random_k(sent, timer)

    def state(self) -> dict[str, Any]:
        """Error feedback (the memory) and the step that seeds random-k's draw."""
        return {"memory": self.memory.detach().clone(), "step": self.step}

    def load_state(self, state: dict[str, Any]) -> None:
        self.memory.copy_(state["memory"])
        self.step = int(state["step"])

    def _exchange_top_k(self, sent: Sparsified, timer: PhaseTimer) -> None:
        """All-gather every rank's (values, indices) in one byte buffer; scatter-add them; average."""
        flat, world, k = self.grads.flat, self.comm.size, self.k
        if world == 1:
            with timer.phase("compression"):
                flat.zero_()
                flat.index_copy_(0, sent.indices, sent.values)
            return
        with timer.phase("compression"):
            width = k * flat.element_size()
            packed = torch.empty(width + k * INDEX_BYTES, dtype=torch.uint8, device=flat.device)
            packed[:width] = sent.values.view(torch.uint8)
            packed[width:] = sent.indices.to(torch.int32).view(torch.uint8)
        with timer.phase("communication"):
            gathered = self.comm.all_gather(packed)
        with timer.phase("compression"):
            values = gathered[:, :width].contiguous().view(flat.dtype).div_(world)
            indices = gathered[:, width:].contiguous().view(torch.int32).long()
            flat.zero_()
            for r in range(world):  # rank by rank, indices distinct within each: the same sums on every rank
                flat.index_add_(0, indices[r], values[r])

    def _exchange_random_k(self, sent: Sparsified, timer: PhaseTimer) -> None:
        """Every rank chose the same indices: sum-all-reduce the k values, average, scatter."""
        flat, world, values = self.grads.flat, self.comm.size, sent.values
        if world > 1:
            with timer.phase("communication"):
                self.comm.all_reduce_sum_(values)
        with timer.phase("compression"):
            if world > 1:
                values.div_(world)
            flat.zero_()
            flat.index_copy_(0, sent.indices, values)

    def plan(self, model: nn.Module) -> CommunicationPlan:
        size = parameter_bytes(model)
        if self.comm.size == 1:
            return CommunicationPlan((), 0, size)
        params = trainable(model)
        n = sum(p.numel() for p in params)
        k, element = ceil_fraction(n, self.density), params[0].element_size()
        if self.selection is Selection.TOP_K:
            return CommunicationPlan(("all-gather",), k * (element + INDEX_BYTES), size)
        return CommunicationPlan(("all-reduce",), k * element, size)
