"""PowerSGD: rank-r gradient compression with error feedback (Vogels, Karimireddy, Jaggi, NeurIPS 2019).

Algorithm 1 of the paper, one step of subspace (power) iteration per optimizer step, laid out as torch's own
``powerSGD_hook`` lays it out (``torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py``) so the two
agree on the same gradients (tests/runner/test_powersgd.py checks it against the hook):

* every gradient with more than one dimension is the matrix ``M = grad.view(n, -1)`` (n x m) and is sent as
  P (n x r) and Q (m x r), r = min(rank, n, m); the other gradients (biases, BatchNorm) are averaged
  exactly by one all-reduce of their flat buffer;
* error feedback: ``M += e`` before compressing, ``e = M - P Q^T`` after (the local matrix minus the
  averaged approximation, as in the paper's code and torch's hook);
* ``Q`` is orthonormalised, ``P = M Q``, the P's of all matrices are summed in one flat all-reduce and
  orthonormalised (QR for r > 2 as torch; for r <= 2 Gram-Schmidt as torch, but twice: see
  :func:`orthogonalize_`), ``Q = M^T P``, the Q's are summed in one flat all-reduce and divided by the
  world size; the gradient becomes ``P Q^T``, the mean of the ranks' approximations, bit-identical on every
  rank because it is computed from all-reduced P and Q only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from mlbench_api.parameters import AlgorithmParameters
from mlbench_runner.algorithms.base import (
    CommunicationPlan,
    DistributedAlgorithm,
    broadcast_state,
    parameter_bytes,
    register,
    trainable,
)
from mlbench_runner.comm import Communicator
from mlbench_runner.timing import PhaseTimer

DEFAULT_RANK = 2


def matrix_shape(tensor: torch.Tensor) -> tuple[int, int] | None:
    """``(n, m)`` of the matrix a gradient of this shape is compressed as; None for one sent uncompressed."""
    if tensor.ndim <= 1 or tensor.numel() == 0:
        return None
    return tensor.shape[0], tensor.numel() // tensor.shape[0]


def compressed_elements(tensor: torch.Tensor, rank: int) -> int:
    """Numbers sent per step for this gradient: r(n + m) for a matrix, all of it for a vector."""
    shape = matrix_shape(tensor)
    if shape is None:
        return tensor.numel()
    n, m = shape
    return min(rank, n, m) * (n + m)


def orthogonalize_(matrices: torch.Tensor) -> None:
    """Orthonormalise the columns of every (k, r) matrix of a (b, k, r) batch in place.

    As torch's hook: QR for r > 2, Gram-Schmidt for r <= 2 (and half precision), but Gram-Schmidt twice.
    One pass (torch's) leaves a column that is zero up to rounding, as when P has rank below r (a gradient of
    rank < r, e.g. a linear layer's gradient from fewer than r samples), normalised to unit length but not
    orthogonal to the others: P P^T is then no projection and the update gets a spurious term as large as
    the gradient. The second pass ("twice is enough", Giraud et al. 2005) fixes that and otherwise changes
    the result only at rounding level. A column that is exactly zero stays zero (torch's becomes NaN).
    """
    rank = matrices.shape[2]
    if rank > 2 and matrices.dtype not in (torch.float16, torch.bfloat16):
        q, _ = torch.linalg.qr(matrices)
        matrices.copy_(q)
        return
    tiny = torch.finfo(matrices.dtype).tiny
    for _ in range(2 if rank > 1 else 1):
        for i in range(rank):
            col = matrices[:, :, i : i + 1]
            col /= torch.linalg.vector_norm(col, dim=1, keepdim=True).clamp_min(tiny)
            if i + 1 < rank:
                rest = matrices[:, :, i + 1 :]
                rest -= torch.sum(col * rest, dim=1, keepdim=True) * col


@dataclass
class MatrixGroup:
    """The gradient matrices of one shape (n, m), consecutive in the buffers so each is one batched tensor."""

    n: int
    m: int
    rank: int
    count: int
    grad: torch.Tensor  #: (count, n, m) view into the flat gradient buffer
    p: torch.Tensor  #: (count, n, r) view into the flat P buffer
    q: torch.Tensor  #: (count, m, r) view into the flat Q buffer
    q_init: torch.Tensor | None = None  #: (count, m, r) the first orthonormal Q (warm start's fallback)


@register("powersgd")
class PowerSGD(DistributedAlgorithm):
    """Rank-r PowerSGD with error feedback and (by default) warm start; see the module doc for the math.

    ``prepare`` makes every ``.grad`` a view into one flat buffer laid out as the algorithm needs it: the
    matrices grouped by shape, each group one contiguous (count, n, m) block (so compressing and decompressing
    is one batched matmul per shape, with no packing copy), then the vectors in one block that is all-reduced
    in place. P and Q live in flat buffers in the same order, so each is one all-reduce.

    Timing: ``synchronize`` opens ``communication`` around the three all-reduce calls only (vectors and P,
    then Q) and ``compression`` around everything else, in five alternating blocks: error feedback, Q's
    orthonormalisation, P = M Q; the division of the vectors, P's orthonormalisation, Q = M^T P; the
    division of Q, the decompression P Q^T into the gradient and the new error. So communicationSeconds is
    time in collectives only and the compression overhead shows up as compute.

    Q is initialised, identically on every rank, as torch's hook initialises it with ``random_seed=seed``: a
    ``numpy.random.RandomState(seed)`` gives each draw a torch seed and the Q's are drawn in bucket order,
    grouped by shape. With warm start the next step reuses the last Q, orthonormalised first as torch's
    hook does; a Q column that came out exactly zero (a matrix whose gradient was zero on every rank) is replaced
    by the first Q's column, else the power iteration would stay at zero for that matrix forever. Without
    warm start a fresh Q is drawn every step.

    ``bucketing`` does not apply: the vectors, the P's and the Q's are always one all-reduce each.
    One rank: the gradient is exact, nothing is compressed or sent, and the plan declares zero bytes.
    Non-parameter state (BatchNorm statistics) is averaged before each evaluation (the base class's).
    """

    def __init__(
        self,
        comm: Communicator,
        bucketing: str = "by-model",
        parameters: AlgorithmParameters | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(comm, bucketing, parameters, seed)
        self.matrix_rank = self.parameters.rank if self.parameters.rank is not None else DEFAULT_RANK
        self.warm_start = self.parameters.warm_start if self.parameters.warm_start is not None else True
        self.groups: list[MatrixGroup] = []
        self._rng = np.random.RandomState(seed)
        self._q_ready = False

    # -- set-up ---------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> nn.Module:
        broadcast_state(model, self.comm)
        params = trainable(model)
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"{self.name} needs one parameter dtype, found {sorted(map(str, dtypes))}")
        dtype, device = params[0].dtype, params[0].device
        by_shape: dict[tuple[int, int], list[nn.Parameter]] = {}  # first appearance order, as torch's hook
        vectors: list[nn.Parameter] = []
        for p in params:
            shape = matrix_shape(p)
            if shape is None:
                vectors.append(p)
            else:
                by_shape.setdefault(shape, []).append(p)
        matrix_elements = sum(p.numel() for group in by_shape.values() for p in group)
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=device)
        self.matrices = self.flat[:matrix_elements]
        self.vectors = self.flat[matrix_elements:]
        offset = 0
        for p in [p for group in by_shape.values() for p in group] + vectors:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        if self.comm.size == 1:
            return model  # nothing to compress: the gradient is exact
        sizes = [(n, m, min(self.matrix_rank, n, m), len(group)) for (n, m), group in by_shape.items()]
        self.p = torch.zeros(sum(c * n * r for n, _, r, c in sizes), dtype=dtype, device=device)
        self.q = torch.zeros(sum(c * m * r for _, m, r, c in sizes), dtype=dtype, device=device)
        self.error = torch.zeros(matrix_elements, dtype=dtype, device=device)
        self.q_init = torch.zeros_like(self.q) if self.warm_start else None
        g_off = p_off = q_off = 0
        for n, m, r, count in sizes:
            self.groups.append(
                MatrixGroup(
                    n,
                    m,
                    r,
                    count,
                    grad=self.flat[g_off : g_off + count * n * m].view(count, n, m),
                    p=self.p[p_off : p_off + count * n * r].view(count, n, r),
                    q=self.q[q_off : q_off + count * m * r].view(count, m, r),
                    q_init=None
                    if self.q_init is None
                    else self.q_init[q_off : q_off + count * m * r].view(count, m, r),
                )
            )
            g_off, p_off, q_off = g_off + count * n * m, p_off + count * n * r, q_off + count * m * r
        return model

    def zero_grad(self, model: nn.Module) -> None:
        self.flat.zero_()

    # -- one step -------------------------------------------------------------------
    def _draw_q(self) -> None:
        """A fresh random orthonormal Q for every matrix, identical on every rank (torch's hook's draw)."""
        generator = torch.Generator().manual_seed(int(self._rng.randint(1_000_000_000)))
        draws = [
            torch.randn(g.m, g.rank, generator=generator, dtype=self.q.dtype).reshape(-1)
            for g in self.groups
            for _ in range(g.count)
        ]
        self.q.copy_(torch.cat(draws))
        for g in self.groups:
            orthogonalize_(g.q)
        if self.q_init is not None and not self._q_ready:
            self.q_init.copy_(self.q)
        self._q_ready = True

    def _reuse_q(self) -> None:
        """Warm start: the last step's Q, orthonormalised; exactly-zero columns restarted from the first Q."""
        for g in self.groups:
            assert g.q_init is not None
            alive = torch.linalg.vector_norm(g.q, dim=1, keepdim=True) > 0
            g.q.copy_(torch.where(alive, g.q, g.q_init))
            orthogonalize_(g.q)

    def synchronize(self, model: nn.Module, timer: PhaseTimer) -> None:
        if self.comm.size == 1:
            return
        world = self.comm.size
        with timer.phase("compression"):
            if self.groups:
                self.matrices.add_(self.error)  # error feedback
                self.error.copy_(self.matrices)  # holds M until the approximation is subtracted below
                if self.warm_start and self._q_ready:
                    self._reuse_q()
                else:
                    self._draw_q()
                for g in self.groups:
                    torch.bmm(g.grad, g.q, out=g.p)
        with timer.phase("communication"):
            if self.vectors.numel():
                self.comm.all_reduce_sum_(self.vectors)
            if self.groups:
                self.comm.all_reduce_sum_(self.p)  # no division: P is orthonormalised next
        with timer.phase("compression"):
            self.vectors.div_(world)
            for g in self.groups:
                orthogonalize_(g.p)
                torch.bmm(g.grad.transpose(1, 2), g.p, out=g.q)
        if not self.groups:
            return
        with timer.phase("communication"):
            self.comm.all_reduce_sum_(self.q)
        with timer.phase("compression"):
            self.q.div_(world)
            for g in self.groups:
                torch.bmm(g.p, g.q.transpose(1, 2), out=g.grad)  # the mean approximation P Q^T
            self.error.sub_(self.matrices)  # e = M - P Q^T

    def state(self) -> dict[str, Any]:
        """Error feedback, the warm-started Q (and the first one), and the generator of fresh draws."""
        name, keys, pos, has_gauss, gauss = cast(tuple[str, np.ndarray, int, int, float], self._rng.get_state())
        state: dict[str, Any] = {
            "rng": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos)},
            "rngGauss": [int(has_gauss), float(gauss)],
            "qReady": self._q_ready,
        }
        if self.groups:
            state["tensors"] = {"error": self.error, "q": self.q, "p": self.p}
            if self.q_init is not None:
                state["tensors"]["qInit"] = self.q_init
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        rng = state["rng"]
        has_gauss, gauss = state["rngGauss"]
        keys = rng["keys"].numpy().astype(np.uint32)
        self._rng.set_state((rng["name"], keys, rng["pos"], has_gauss, gauss))
        self._q_ready = bool(state["qReady"])
        tensors = state.get("tensors", {})
        for name, target in (("error", "error"), ("q", "q"), ("p", "p"), ("qInit", "q_init")):
            if name in tensors and getattr(self, target, None) is not None:
                getattr(self, target).copy_(tensors[name])

    def plan(self, model: nn.Module) -> CommunicationPlan:
        size = parameter_bytes(model)
        if self.comm.size == 1:
            return CommunicationPlan((), 0, size)
        sent = sum(compressed_elements(p, self.matrix_rank) * p.element_size() for p in trainable(model))
        return CommunicationPlan(("all-reduce",), sent, size)
