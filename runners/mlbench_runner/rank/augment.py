"""Batch-level He et al. augmentation on the device: 4-pixel zero pad + random 32x32 crop,
random horizontal flip, then per-channel normalisation. One gather per batch, no Python
loop over samples (airbench style).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAD = 4


def crop_flip(x: torch.Tensor, generator: torch.Generator, pad: int = PAD) -> torch.Tensor:
    """Random ``pad``-pixel-padded crop and 50 % horizontal flip of float NCHW images.

    Padding is with zeros on the raw 0-255 image, i.e. before normalisation, as
    ``RandomCrop(32, padding=4)`` before ``Normalize`` does.
    """
    n, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dev = x.device
    dy = torch.randint(0, 2 * pad + 1, (n,), device=dev, generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), device=dev, generator=generator)
    flip = torch.rand(n, device=dev, generator=generator) < 0.5
    ar_h = torch.arange(h, device=dev)
    ar_w = torch.arange(w, device=dev)
    rows = dy[:, None] + ar_h[None, :]
    cols = dx[:, None] + torch.where(flip[:, None], (w - 1) - ar_w[None, :], ar_w[None, :])
    batch = torch.arange(n, device=dev)[:, None, None, None]
    chan = torch.arange(c, device=dev)[None, :, None, None]
    return padded[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]


def normalize(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std with (1, C, 1, 1) statistics on the 0-255 scale."""
    return (x - mean) / std
