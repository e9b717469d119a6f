"""The model's parameters in one flat buffer, and the closed division's SGD update applied to it.

The eager reference step runs ``torch.optim.SGD``: per parameter tensor (or per foreach
group) a handful of kernels, with the learning rate a Python float baked into each launch.
The fast path keeps every parameter as a view into one flat buffer, next to the gradients
(already one flat buffer, :class:`~mlbench_runner.algorithms.base.FlatGradients`), so the
whole update is four elementwise kernels over two tensors, and the learning rate is a
0-d tensor on the device: the update can be captured once in a CUDA graph and replayed with
each step's rate.

The update is ``torch.optim.SGD``'s (``dampening`` 0), written out::

    d = g + weight_decay * p
    buf = momentum * buf + d            # buf starts at 0, so step 1 gives buf = d, as torch's clone does
    d = d + momentum * buf  (nesterov)  # or d = buf without nesterov
    p = p - lr * d

Per element this is the same arithmetic as torch's; the last line is one fused
multiply-add here and may round differently in the last bit (the equivalence test allows
round-off, nothing more).
"""

from __future__ import annotations

import torch
from torch import nn


def dense_view(flat: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """``flat[offset : offset + like.numel()]`` shaped *and strided* like ``like``.

    Keeping ``like``'s strides keeps a channels_last weight channels_last, and makes the
    gradient's flat layout match the parameter's element for element.
    """
    n = like.numel()
    if not (like.is_contiguous() or like.is_contiguous(memory_format=torch.channels_last)):
        raise ValueError(
            f"a flat buffer needs dense tensors; got strides {like.stride()} for shape {tuple(like.shape)}"
        )
    return flat[offset : offset + n].as_strided(like.shape, like.stride())


def _one_dtype(tensors: list[torch.Tensor], what: str) -> torch.dtype:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"{what} needs one parameter dtype, found {sorted(map(str, dtypes))}")
    return tensors[0].dtype


class FlatParameters:
    """Every trainable parameter's storage moved into one flat buffer (same values, same strides).

    The module keeps its ``nn.Parameter`` objects (autograd, ``state_dict`` and hooks see
    nothing new); only their ``.data`` now lives in :attr:`flat`.
    """

    def __init__(self, model: nn.Module) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        dtype = _one_dtype(list(params), "the flat fast path")
        self.flat = torch.empty(sum(p.numel() for p in params), dtype=dtype, device=params[0].device)
        offset = 0
        with torch.no_grad():
            for p in params:
                view = dense_view(self.flat, offset, p)
                view.copy_(p)
                p.data = view
                offset += p.numel()
        self.params = params


class FlatSGD:
    """``torch.optim.SGD`` (momentum, Nesterov, weight decay, no dampening) on flat buffers.

    ``params`` and ``grads`` must be laid out alike (both built over the model's trainable
    parameters in order, with :func:`dense_view`). :meth:`set_lr` writes the rate into a
    device tensor, so a captured :meth:`step` replays with the current rate.
    """

    def __init__(
        self,
        params: torch.Tensor,
        grads: torch.Tensor,
        lr: float,
        *,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        if params.shape != grads.shape or params.dtype != grads.dtype:
            raise ValueError("FlatSGD: parameters and gradients must be flat buffers of one shape and dtype")
        if nesterov and momentum <= 0:
            raise ValueError("nesterov: needs a positive momentum")
        self.params, self.grads = params, grads
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay
        self.neg_lr = torch.full((), -lr, dtype=params.dtype, device=params.device)
        self.buffer = torch.zeros_like(params) if momentum else None

    def set_lr(self, lr: float) -> None:
        self.neg_lr.fill_(-lr)

    def step(self) -> None:
        """Apply the update and zero the gradients for the next backward (all in place)."""
        p, d = self.params, self.grads
        if self.weight_decay:
            d.add_(p, alpha=self.weight_decay)
        update = d
        if self.buffer is not None:
            self.buffer.mul_(self.momentum).add_(d)
            if self.nesterov:
                d.add_(self.buffer, alpha=self.momentum)
            else:
                update = self.buffer
        p.addcmul_(update, self.neg_lr)
        d.zero_()

    def state(self) -> list[torch.Tensor]:
        """The tensors a snapshot must keep (the momentum buffer and the rate)."""
        return [t for t in (self.buffer, self.neg_lr) if t is not None]
