"""The Transformer of "Attention Is All You Need" as fairseq's ``transformer_wmt_en_de`` (task 4b's model).

Built from torch's own layers (native LayerNorm and attention, as the public recipe says of its changes from
MLPerf's FusedLayerNorm): shared source/target/output embeddings over one joined vocabulary scaled by
sqrt(d_model), sinusoidal positions, post-norm layers (fairseq's default; ``norm_first`` for pre-norm, with a
final LayerNorm on each stack as fairseq's ``--encoder-normalize-before``). :data:`BASE` is the recipe's size;
the smoke tasks use a small one. Training and :meth:`Transformer.decode` run the decoder over whole prefixes;
the beam search decodes one token at a time from cached keys and values (:meth:`Transformer.decode_step`,
``transformer_cache``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from mlbench_runner.translation.transformer_cache import DecoderCache, empty_cache, layer_step, source_mask


@dataclass(frozen=True)
class TransformerShape:
    """Sizes of the network (fairseq's argument names in the comments)."""

    d_model: int = 512  # --encoder-embed-dim / --decoder-embed-dim
    heads: int = 8  # --encoder-attention-heads
    ffn: int = 2048  # --encoder-ffn-embed-dim
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    norm_first: bool = False  # --encoder-normalize-before / --decoder-normalize-before
    max_positions: int = 1024


#: transformer_wmt_en_de (Transformer base), as the recipe trains it.
BASE = TransformerShape()


def sinusoids(positions: int, dim: int) -> torch.Tensor:
    """fairseq's sinusoidal embedding: sin over the first half of the features, cos over the second."""
    half = dim // 2
    rate = math.log(10000.0) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float32) * -rate)
    angles = torch.arange(positions, dtype=torch.float32).unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    return nn.functional.pad(table, (0, dim % 2))


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """True above the diagonal: a target position may not attend to later ones."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)


class Transformer(nn.Module):
    """Encoder-decoder over one shared vocabulary; ``forward(source, previous)`` gives the next-token logits."""

    def __init__(self, vocab_size: int, pad: int, shape: TransformerShape = BASE) -> None:
        super().__init__()
        self.pad, self.shape = pad, shape
        d = shape.d_model
        self.embed = nn.Embedding(vocab_size, d, padding_idx=pad)
        nn.init.normal_(self.embed.weight, mean=0.0, std=d**-0.5)
        nn.init.zeros_(self.embed.weight[pad])
        self.positions: torch.Tensor
        self.register_buffer("positions", sinusoids(shape.max_positions, d), persistent=False)
        self.dropout = nn.Dropout(shape.dropout)

        def norm() -> nn.Module | None:
            return nn.LayerNorm(d) if shape.norm_first else None

        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(
                d, shape.heads, shape.ffn, shape.dropout, batch_first=True, norm_first=shape.norm_first
            ),
            shape.encoder_layers,
            norm=norm(),
            enable_nested_tensor=False,
        )
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(
                d, shape.heads, shape.ffn, shape.dropout, batch_first=True, norm_first=shape.norm_first
            ),
            shape.decoder_layers,
            norm=norm(),
        )

    def _embed(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Scaled embeddings plus the positions ``start``, ``start + 1``, ... of (batch, length) ``tokens``."""
        x = self.embed(tokens) * math.sqrt(self.shape.d_model)
        return self.dropout(x + self.positions[start : start + tokens.shape[1]].to(x.dtype))

    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output for (batch, length) source ids, and the source's padding mask (True at pad)."""
        padding = source.eq(self.pad)
        return self.encoder(self._embed(source), src_key_padding_mask=padding), padding

    def decode(self, previous: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """Logits (batch, length, vocab) for each next target token given the ``previous`` ones."""
        length = previous.shape[1]
        x = self.decoder(
            self._embed(previous),
            memory,
            tgt_mask=causal_mask(length, previous.device),
            tgt_key_padding_mask=previous.eq(self.pad),
            memory_key_padding_mask=padding,
            tgt_is_causal=True,
        )
        return x @ self.embed.weight.t()  # the output projection shares the embedding (--share-all-embeddings)

    def decode_step(
        self, previous: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor, state: DecoderCache | None
    ) -> tuple[torch.Tensor, None, DecoderCache]:
        """:meth:`decode` of the tokens ``previous`` (none of them pad) that follow a prefix whose ``state`` (each
        layer's cached keys and values; None: the empty prefix) is given, and the state after them; no attention
        weights (the Transformer's search has no coverage penalty). The beam search's one-token step
        (:class:`~.decoding.Stepping`), as fairseq's incremental decoding."""
        decoder_layers = [layer for layer in self.decoder.layers if isinstance(layer, nn.TransformerDecoderLayer)]
        cache = state if state is not None else empty_cache(decoder_layers, memory)
        x, mask = self._embed(previous, cache.length), source_mask(padding)
        layers = []
        for layer, kept in zip(decoder_layers, cache.layers, strict=True):
            x, grown = layer_step(layer, x, kept, cache.length, mask)
            layers.append(grown)
        if self.decoder.norm is not None:
            x = self.decoder.norm(x)
        return x @ self.embed.weight.t(), None, DecoderCache(tuple(layers), cache.length + previous.shape[1])

    @staticmethod
    def reorder(state: DecoderCache, rows: torch.Tensor) -> DecoderCache:
        """The decoder state of batch rows ``rows`` (a beam's survivors, in their new order)."""
        return state.reorder(rows)

    def forward(self, source: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        memory, padding = self.encode(source)
        return self.decode(previous, memory, padding)


def shift_right(target: torch.Tensor, bos: int, pad: int) -> torch.Tensor:
    """The decoder's input for teacher forcing: bos, then the target without its last column (pads stay pads)."""
    previous = torch.full_like(target, pad)
    previous[:, 0] = bos
    previous[:, 1:] = target[:, :-1]
    return previous.masked_fill(target.eq(pad), pad)
