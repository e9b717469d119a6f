"""Incremental (step) decoding through torch's :class:`~torch.nn.TransformerDecoderLayer`, as fairseq's
``incremental_state``: each layer keeps its self-attention keys and values of the tokens decoded so far, one row per
hypothesis, and the encoder-attention keys and values computed once from the encoder's output; a step projects the
new tokens only and attends over the cache. :meth:`DecoderCache.reorder` keeps a beam's survivors' rows.

The layer's own weights and sublayers (``self_attn``, ``multihead_attn``, the norms, the feed-forward, the
dropouts) are used as :meth:`TransformerDecoderLayer.forward` uses them, post-norm or pre-norm, so a step gives the
logits the whole-prefix decoder gives up to rounding (tests/runner/test_transformer_decoding.py). Prefixes hold no
pad (the search never makes one): there is no target key-padding mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class LayerCache:
    """One decoder layer's cache, each (rows, heads, length, head dim): the self-attention keys and values of the
    tokens so far, and the encoder attention's keys and values over the source."""

    keys: torch.Tensor
    values: torch.Tensor
    memory_keys: torch.Tensor
    memory_values: torch.Tensor

    def reorder(self, rows: torch.Tensor) -> LayerCache:
        return LayerCache(
            *(t.index_select(0, rows) for t in (self.keys, self.values, self.memory_keys, self.memory_values))
        )


@dataclass(frozen=True)
class DecoderCache:
    """Every decoder layer's :class:`LayerCache` and the number of target tokens they hold (the next position)."""

    layers: tuple[LayerCache, ...]
    length: int

    def reorder(self, rows: torch.Tensor) -> DecoderCache:
        """The cache of batch rows ``rows`` (a beam's survivors, each its origin, in their new order)."""
        return DecoderCache(tuple(layer.reorder(rows) for layer in self.layers), self.length)


def _project(attention: nn.MultiheadAttention, x: torch.Tensor, part: int) -> torch.Tensor:
    """The query (0), key (1) or value (2) projection of x (rows, length, d) as (rows, heads, length, head dim)."""
    d = attention.embed_dim
    if attention.in_proj_weight is None:
        raise ValueError("step decoding: the attention must project queries, keys and values with one weight")
    bias = attention.in_proj_bias[part * d : (part + 1) * d] if attention.in_proj_bias is not None else None
    y = F.linear(x, attention.in_proj_weight[part * d : (part + 1) * d], bias)
    return y.view(x.shape[0], x.shape[1], attention.num_heads, attention.head_dim).transpose(1, 2)


def _attend(
    attention: nn.MultiheadAttention,
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Scaled dot-product attention of projected queries over keys/values (``mask``: True where a query may look),
    the heads joined and projected out as the layer's attention does."""
    dropout = attention.dropout if attention.training else 0.0
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, dropout_p=dropout)
    rows, heads, length, head_dim = out.shape
    return attention.out_proj(out.transpose(1, 2).reshape(rows, length, heads * head_dim))


def empty_cache(layers: list[nn.TransformerDecoderLayer], memory: torch.Tensor) -> DecoderCache:
    """The cache before the first target token: each layer's encoder keys and values, projected once."""
    caches = []
    for layer in layers:
        mha = layer.multihead_attn
        keys, values = _project(mha, memory, 1), _project(mha, memory, 2)
        caches.append(LayerCache(keys[:, :, :0], values[:, :, :0], keys, values))
    return DecoderCache(tuple(caches), 0)


def source_mask(padding: torch.Tensor) -> torch.Tensor:
    """The encoder attention's mask (rows, 1, 1, source length): True at the source's real tokens."""
    return ~padding[:, None, None, :]


def _causal(start: int, new: int, device: torch.device) -> torch.Tensor | None:
    """True where new token i (position start + i) may look at position j (j <= start + i); None for one token."""
    if new == 1:
        return None
    keys = torch.arange(start + new, device=device)
    return keys.unsqueeze(0) <= torch.arange(start, start + new, device=device).unsqueeze(1)


def _self_attention(
    layer: nn.TransformerDecoderLayer, h: torch.Tensor, cache: LayerCache, start: int
) -> tuple[torch.Tensor, LayerCache]:
    """The self-attention block (dropout included) of the new tokens over the cached ones and themselves, and the
    cache with their keys and values appended."""
    sa = layer.self_attn
    keys = torch.cat([cache.keys, _project(sa, h, 1)], dim=2)
    values = torch.cat([cache.values, _project(sa, h, 2)], dim=2)
    out = _attend(sa, _project(sa, h, 0), keys, values, _causal(start, h.shape[1], h.device))
    return layer.dropout1(out), LayerCache(keys, values, cache.memory_keys, cache.memory_values)


def layer_step(
    layer: nn.TransformerDecoderLayer, x: torch.Tensor, cache: LayerCache, start: int, mask: torch.Tensor
) -> tuple[torch.Tensor, LayerCache]:
    """:meth:`TransformerDecoderLayer.forward` on the new tokens' inputs ``x`` (rows, new, d) after ``start`` cached
    tokens (``mask``: :func:`source_mask`); the cache with the new tokens' keys and values appended."""
    mha = layer.multihead_attn

    def source_block(h: torch.Tensor) -> torch.Tensor:
        return layer.dropout2(_attend(mha, _project(mha, h, 0), cache.memory_keys, cache.memory_values, mask))

    def feed_forward(h: torch.Tensor) -> torch.Tensor:
        return layer.dropout3(layer.linear2(layer.dropout(layer.activation(layer.linear1(h)))))

    if layer.norm_first:
        attended, grown = _self_attention(layer, layer.norm1(x), cache, start)
        x = x + attended
        x = x + source_block(layer.norm2(x))
        return x + feed_forward(layer.norm3(x)), grown
    attended, grown = _self_attention(layer, x, cache, start)
    x = layer.norm1(x + attended)
    x = layer.norm2(x + source_block(x))
    return layer.norm3(x + feed_forward(x)), grown
