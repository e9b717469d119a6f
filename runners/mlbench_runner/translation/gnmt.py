"""GNMT (Wu et al. 2016) as MLPerf's and mlbench-core's reference builds it (task 4a's model).

Encoder: the shared embedding, a bidirectional first LSTM layer, then unidirectional layers, residual from the
third layer on. Decoder ("GNMT v2" attention): the first LSTM layer's output queries normalized Bahdanau
attention over the encoder's output; every further layer reads its input concatenated with that context,
residual from the third layer on; a linear classifier gives the logits. The decoder starts from a zero state,
so the logits are a function of the source and the target prefix only (the interface of
:class:`~.transformer.Transformer`: ``encode``, ``decode``, ``forward``). Every weight starts uniform in
[-0.1, 0.1] as the reference's. Dropout goes before every LSTM layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

#: The reference's uniform initialisation range.
INIT = 0.1
#: The decoder's LSTMs' (h, c), each (1, batch, hidden): the attention LSTM's first, then each decoder layer's.
LstmStates = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class GnmtShape:
    """Sizes of the network (the reference's ``model_args`` in the comments)."""

    hidden: int = 1024  # hidden_size: the embedding, every LSTM and the attention
    layers: int = 4  # num_layers, in the encoder and in the decoder
    dropout: float = 0.2
    share_embedding: bool = True  # one embedding for source and target (one joined BPE vocabulary)


#: Task 4a's model: 4 + 4 layers, 1024 wide, dropout 0.2, shared embedding.
GNMT_4A = GnmtShape()


class BahdanauAttention(nn.Module):
    """Normalized Bahdanau attention: score(q, k) = g * (v / |v|) . tanh(W_q q + W_k k + b), g starting at
    1/sqrt(units); a softmax over the non-pad keys; the context is the weighted sum of the (raw) keys."""

    def __init__(self, query_size: int, key_size: int, units: int) -> None:
        super().__init__()
        self.linear_q = nn.Linear(query_size, units, bias=False)
        self.linear_k = nn.Linear(key_size, units, bias=False)
        self.linear_att = nn.Parameter(torch.empty(units).uniform_(-INIT, INIT))
        self.normalize_scalar = nn.Parameter(torch.tensor(1.0 / math.sqrt(units)))
        self.normalize_bias = nn.Parameter(torch.zeros(units))

    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, padding: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Context (batch, t_q, key_size) and weights (batch, t_q, t_k) for queries (batch, t_q, query_size) over
        keys (batch, t_k, key_size); ``padding`` (batch, t_k) is True at pad keys, which get weight 0."""
        q = self.linear_q(query).unsqueeze(2)  # (b, t_q, 1, n)
        k = self.linear_k(keys).unsqueeze(1)  # (b, 1, t_k, n)
        v = self.linear_att.float()
        v = (v / v.norm()).to(q.dtype) * self.normalize_scalar.to(q.dtype)
        scores = torch.tanh(q + k + self.normalize_bias.to(q.dtype)) @ v  # (b, t_q, t_k)
        scores = scores.float().masked_fill(padding.unsqueeze(1), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return torch.bmm(weights.to(keys.dtype), keys), weights


class Gnmt(nn.Module):
    """Encoder-decoder with attention; ``forward(source, previous)`` gives the next-token logits."""

    def __init__(self, vocab_size: int, pad: int, shape: GnmtShape = GNMT_4A) -> None:
        super().__init__()
        if shape.layers < 2:
            raise ValueError(f"gnmt: layers must be at least 2 (a bidirectional one and one more), got {shape.layers}")
        self.pad, self.shape = pad, shape
        h = shape.hidden
        self.embed_source = nn.Embedding(vocab_size, h, padding_idx=pad)
        self.embed_target = self.embed_source if shape.share_embedding else nn.Embedding(vocab_size, h, pad)
        self.dropout = nn.Dropout(shape.dropout)
        self.encoder = nn.ModuleList(
            [nn.LSTM(h, h, batch_first=True, bidirectional=True), nn.LSTM(2 * h, h, batch_first=True)]
            + [nn.LSTM(h, h, batch_first=True) for _ in range(shape.layers - 2)]
        )
        self.attention_rnn = nn.LSTM(h, h, batch_first=True)
        self.attention = BahdanauAttention(h, h, h)
        self.decoder = nn.ModuleList([nn.LSTM(2 * h, h, batch_first=True) for _ in range(shape.layers - 1)])
        self.classifier = nn.Linear(h, vocab_size)
        for name, p in self.named_parameters():
            if not name.startswith("attention.normalize"):
                nn.init.uniform_(p, -INIT, INIT)
        with torch.no_grad():
            self.embed_source.weight[pad].zero_()
            self.embed_target.weight[pad].zero_()

    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output (batch, length, hidden) for right-padded source ids, and the padding mask (True at
        pad). The bidirectional layer reads each sentence packed, so its backward half starts at the last token."""
        padding = source.eq(self.pad)
        lengths = (~padding).sum(dim=1).clamp(min=1).cpu()
        x = self.dropout(self.embed_source(source))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.encoder[0](packed)
        x, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=source.shape[1])
        x, _ = self.encoder[1](self.dropout(x))
        for layer in self.encoder[2:]:  # residual from the third layer on
            residual = x
            x, _ = layer(self.dropout(x))
            x = x + residual
        return x, padding

    def decode_attention(
        self, previous: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (batch, length, vocab) for each next target token given the ``previous`` ones, and the attention
        weights (batch, length, source length) that produced them."""
        logits, weights, _ = self.decode_step(previous, memory, padding, None)
        return logits, weights

    def decode_step(
        self, previous: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor, state: LstmStates | None
    ) -> tuple[torch.Tensor, torch.Tensor, LstmStates]:
        """:meth:`decode_attention` of the tokens ``previous`` that follow a prefix whose decoder ``state`` (each
        LSTM's (h, c), None: the empty prefix, the zero state) is given, and the state after them. The decoder's
        only memory of the prefix is that state, so decoding one token at a time is decoding the whole prefix."""
        old: LstmStates | list[None] = state if state is not None else [None] * len(self.decoder) + [None]
        x, first = self.attention_rnn(self.dropout(self.embed_target(previous)), old[0])
        context, weights = self.attention(x, memory, padding)
        new = [first]
        for i, layer in enumerate(self.decoder):
            residual = x
            x, kept = layer(torch.cat([self.dropout(x), context], dim=2), old[i + 1])
            x = x + residual if i > 0 else x  # residual from the decoder's second LSTM (the third layer) on
            new.append(kept)
        return self.classifier(x), weights, new

    @staticmethod
    def reorder(state: LstmStates, rows: torch.Tensor) -> LstmStates:
        """The decoder state of batch rows ``rows`` (a beam's survivors, in their new order)."""
        return [(h.index_select(1, rows), c.index_select(1, rows)) for h, c in state]

    def decode(self, previous: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return self.decode_attention(previous, memory, padding)[0]

    def forward(self, source: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        memory, padding = self.encode(source)
        return self.decode(previous, memory, padding)
