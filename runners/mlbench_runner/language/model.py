"""The AWD-LSTM (Merity et al. 2017; salesforce/awd-lstm-lm, as mlbench-core's LSTMLanguageModel): an embedding
with embedding dropout, stacked one-layer LSTMs with weight drop (DropConnect on the hidden-to-hidden matrix) and
locked (variational) dropout between them, and a decoder tied to the embedding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

Hidden = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class AwdLstmShape:
    """The WikiText-2 model of the reference (emsize 400, nhid 1150, 3 layers; its WT2 dropouts)."""

    embedding: int = 400
    hidden: int = 1150
    layers: int = 3
    dropout: float = 0.4  #: on the last layer's output
    dropout_hidden: float = 0.2  #: between LSTM layers (the reference's WikiText-2 command sets 0.2)
    dropout_input: float = 0.65  #: on the embedded input
    dropout_embedding: float = 0.1  #: whole words of the embedding
    weight_drop: float = 0.5  #: DropConnect on every layer's hidden-to-hidden weights
    tie_weights: bool = True


def locked_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """One dropout mask per sequence and feature, the same at every time step (dim 0 is time)."""
    if not training or p == 0:
        return x
    mask = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1 - p) / (1 - p)
    return x * mask


def embedding_dropout(embed: nn.Embedding, words: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Drop whole rows (words) of the embedding matrix, scaling the rest by 1 / (1 - p)."""
    weight = embed.weight
    if training and p > 0:
        mask = weight.new_empty(weight.size(0), 1).bernoulli_(1 - p) / (1 - p)
        weight = weight * mask
    return F.embedding(words, weight)


@dataclass(frozen=True)
class Forward:
    logits: torch.Tensor  #: (time * batch, vocabulary)
    hidden: Hidden
    raw: torch.Tensor  #: the last layer's output before dropout (TAR)
    dropped: torch.Tensor  #: the last layer's output after dropout (AR)


class AwdLstm(nn.Module):
    def __init__(self, vocabulary: int, shape: AwdLstmShape = AwdLstmShape()) -> None:
        super().__init__()
        self.shape = shape
        last = shape.embedding if shape.tie_weights else shape.hidden
        self.widths = [shape.hidden if i < shape.layers - 1 else last for i in range(shape.layers)]
        self.encoder = nn.Embedding(vocabulary, shape.embedding)
        self.rnns = nn.ModuleList(
            nn.LSTM(shape.embedding if i == 0 else self.widths[i - 1], self.widths[i]) for i in range(shape.layers)
        )
        self.decoder = nn.Linear(last, vocabulary)
        if shape.tie_weights:
            self.decoder.weight = self.encoder.weight
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def init_hidden(self, batch: int) -> Hidden:
        weight = self.encoder.weight
        return [(weight.new_zeros(1, batch, w), weight.new_zeros(1, batch, w)) for w in self.widths]

    def _layer(self, index: int, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        rnn = self.rnns[index]
        assert isinstance(rnn, nn.LSTM)
        p = self.shape.weight_drop
        if not self.training or p == 0:
            return rnn(x, state)
        dropped = F.dropout(
            rnn.get_parameter("weight_hh_l0"), p=p, training=True
        )  # DropConnect: one mask per forward pass
        return functional_call(rnn, {"weight_hh_l0": dropped}, (x, state), strict=False)

    def forward(self, words: torch.Tensor, hidden: Hidden) -> Forward:
        s = self.shape
        x = embedding_dropout(self.encoder, words, s.dropout_embedding, self.training)
        x = locked_dropout(x, s.dropout_input, self.training)
        states: Hidden = []
        raw = x
        for i in range(s.layers):
            raw, state = self._layer(i, x, hidden[i])
            states.append(state)
            x = locked_dropout(raw, s.dropout_hidden if i < s.layers - 1 else s.dropout, self.training)
        logits = self.decoder(x.reshape(-1, x.size(2)))
        return Forward(logits, states, raw, x)


def detach(hidden: Hidden) -> Hidden:
    """Truncated BPTT: the state carries over windows, its gradient does not."""
    return [(h.detach(), c.detach()) for h, c in hidden]
