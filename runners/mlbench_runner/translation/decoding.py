"""Greedy and beam search over a :class:`Seq2Seq` model (the Transformer, GNMT), as fairseq's SequenceGenerator
searches.

A hypothesis's score is the sum of its tokens' log-probabilities (eos included) divided by a length penalty:
``length ** length_penalty`` (fairseq's ``--lenpen``; 1.0 is the mean per token, 0.0 the raw sum), or with a
``length_const`` c GNMT's ``((c + length) / (c + 1)) ** length_penalty``; GNMT's coverage penalty adds
``coverage * sum_j log(min(1, attention on source token j summed over the steps))`` (a log of 0 counts 0, as the
reference). Each step runs the decoder over the whole prefix, or, for a model that carries its prefix in a
decoder state (:class:`Stepping`: GNMT's LSTM states, the Transformer's cached attention keys and values), over the
last token only from the state the prefix left, the survivors' states reordered as the beam is (``incremental``,
the default: the same hypotheses and scores up to rounding, without re-running the decoder over the prefix).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


class Seq2Seq(Protocol):
    """What the search needs of a model: its pad index, the encoder and the decoder over a whole prefix."""

    pad: int

    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def decode(self, previous: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Attending(Seq2Seq, Protocol):
    """A model whose decoder also returns its attention weights (batch, length, source length): GNMT."""

    def decode_attention(
        self, previous: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class Stepping(Seq2Seq, Protocol):
    """A model whose decoder carries its prefix in a state (GNMT's LSTMs, the Transformer's key/value cache): the
    logits of the tokens after the prefix, their attention (batch, tokens, source length) when the model reports it
    (GNMT; None: the Transformer), and the state after them. ``reorder`` keeps the state of the given rows."""

    def decode_step(
        self, previous: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None, Any]: ...

    def reorder(self, state: Any, rows: torch.Tensor) -> Any: ...


class Scorer:
    """The next token's log-probabilities for every live hypothesis, and the attention each has paid per source
    token so far when the coverage penalty needs it: over the whole prefix, or one step from a :class:`Stepping`
    model's state (:meth:`survivors` then carries the state and the attention sums into the next step)."""

    def __init__(
        self, model: Seq2Seq, memory: torch.Tensor, padding: torch.Tensor, coverage: float, incremental: bool
    ) -> None:
        self.model, self.memory, self.padding, self.coverage = model, memory, padding, coverage
        self.stepping = model if incremental and isinstance(model, Stepping) else None
        self.state: Any = None
        self.covered: torch.Tensor | None = None  #: (rows, source length): attention summed over the steps

    def __call__(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.stepping is None:
            return scored_step(self.model, tokens, self.memory, self.padding, self.coverage)
        logits, attention, self.state = self.stepping.decode_step(tokens[:, -1:], self.memory, self.padding, self.state)
        logp = torch.log_softmax(masked_last(logits, self.model.pad, int(tokens[0, 0])), dim=-1)
        if self.coverage == 0.0:
            return logp, None
        if attention is None:
            raise ValueError("coverage penalty: the model does not report its attention (GNMT does)")
        step = attention[:, 0].float()
        self.covered = step if self.covered is None else self.covered + step
        return logp, self.covered.unsqueeze(1)

    def survivors(self, rows: list[int]) -> None:
        """Keep the state of hypotheses ``rows`` (each next row's origin), in that order."""
        if self.stepping is None:
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.memory.device)
        self.state = self.stepping.reorder(self.state, index)
        if self.covered is not None:
            self.covered = self.covered.index_select(0, index)


def masked_last(logits: torch.Tensor, pad: int, bos: int) -> torch.Tensor:
    """fp32 logits of the last position; pad and bos are never generated (fairseq masks them too)."""
    logits = logits[:, -1].float()
    logits[:, pad] = float("-inf")
    logits[:, bos] = float("-inf")
    return logits


def next_token_logits(
    model: Seq2Seq, tokens: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor
) -> torch.Tensor:
    """fp32 logits of the token after ``tokens`` (every prefix starts with bos)."""
    return masked_last(model.decode(tokens, memory, padding), model.pad, int(tokens[0, 0]))


@torch.no_grad()
def greedy(model: Seq2Seq, source: torch.Tensor, *, bos: int, eos: int, max_length: int) -> list[list[int]]:
    """The most probable next token at each step, until eos or ``max_length`` tokens; eos is not returned."""
    memory, padding = model.encode(source)
    batch = source.shape[0]
    tokens = torch.full((batch, 1), bos, dtype=torch.long, device=source.device)
    done = torch.zeros(batch, dtype=torch.bool, device=source.device)
    for _ in range(max_length):
        step = next_token_logits(model, tokens, memory, padding).argmax(dim=-1).masked_fill(done, eos)
        tokens = torch.cat([tokens, step.unsqueeze(1)], dim=1)
        done |= step.eq(eos)
        if bool(done.all()):
            break
    return [_until_eos(row[1:].tolist(), eos) for row in tokens]


def _until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


def normalized(score: float, length: int, length_penalty: float, length_const: float | None = None) -> float:
    """A finished hypothesis's score: its log-probability over length**length_penalty, or over GNMT's
    ((c + length) / (c + 1))**length_penalty with ``length_const`` c (length counts eos)."""
    if length_const is None:
        return score / (length**length_penalty)
    return score / (((length_const + length) / (length_const + 1.0)) ** length_penalty)


def coverage_penalty(attention: torch.Tensor, weight: float) -> float:
    """GNMT's ``weight * sum_j log(min(1, sum_i attention[i, j]))`` over source tokens j (log 0 counts 0)."""
    if weight == 0.0:
        return 0.0
    logs = attention.float().sum(dim=0).clamp(max=1.0).log()
    return weight * float(logs.masked_fill(torch.isinf(logs), 0.0).sum())


def scored_step(
    model: Seq2Seq, tokens: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor, coverage: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the next token, and the attention over every step so far when ``coverage`` needs it."""
    if coverage == 0.0:
        return torch.log_softmax(next_token_logits(model, tokens, memory, padding), dim=-1), None
    if not isinstance(model, Attending):
        raise ValueError("coverage penalty: the model does not report its attention (GNMT does)")
    logits, attention = model.decode_attention(tokens, memory, padding)
    return torch.log_softmax(masked_last(logits, model.pad, int(tokens[0, 0])), dim=-1), attention


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    source: torch.Tensor,
    *,
    bos: int,
    eos: int,
    max_length: int,
    beam: int,
    length_penalty: float = 1.0,
    length_const: float | None = None,
    coverage: float = 0.0,
    incremental: bool = True,
) -> list[list[int]]:
    """The best hypothesis per sentence (:func:`nbest`'s first; [] for none); eos is not returned."""
    found = nbest(
        model, source, bos=bos, eos=eos, max_length=max_length, beam=beam, length_penalty=length_penalty,
        length_const=length_const, coverage=coverage, incremental=incremental,
    )  # fmt: skip
    return [hypotheses[0][1] if hypotheses else [] for hypotheses in found]


@torch.no_grad()
def nbest(
    model: Seq2Seq,
    source: torch.Tensor,
    *,
    bos: int,
    eos: int,
    max_length: int,
    beam: int,
    length_penalty: float = 1.0,
    length_const: float | None = None,
    coverage: float = 0.0,
    incremental: bool = True,
) -> list[list[tuple[float, list[int]]]]:
    """Every finished hypothesis per sentence (at most ``beam``) with its normalised score, best first (ties in
    the order they finished); eos is not returned.

    At each step every live hypothesis extends by its ``beam`` best tokens (``2 * beam`` candidates per sentence,
    as fairseq, so that ``beam`` survive when some end); a candidate among the best ``beam`` that ends in eos is
    finished with its normalised score, the best ``beam`` others go on. A sentence is done once it has ``beam``
    finished hypotheses (fairseq's default early stop); at ``max_length`` the best live ones finish as they are.
    ``length_const`` and ``coverage`` are GNMT's length normalisation and coverage penalty (module docstring);
    ``incremental`` decodes a :class:`Stepping` model one token at a time. The caller puts the model in eval mode.
    """
    batch = source.shape[0]
    memory, padding = model.encode(source)
    memory = memory.repeat_interleave(beam, dim=0)
    padding = padding.repeat_interleave(beam, dim=0)
    tokens = torch.full((batch * beam, 1), bos, dtype=torch.long, device=source.device)
    scores = torch.zeros(batch, beam, device=source.device)
    scores[:, 1:] = float("-inf")  # all beams start equal: keep one, or the first step picks one token beam times
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    scorer = Scorer(model, memory, padding, coverage, incremental)
    for length in range(1, max_length + 1):
        logp, attention = scorer(tokens)
        origins: list[int] = []
        vocab = logp.shape[-1]
        total = (scores.view(-1, 1) + logp).view(batch, beam * vocab)
        top, flat = total.topk(2 * beam, dim=1)
        origin, word = flat // vocab, flat % vocab
        next_tokens, next_scores = [], torch.full((batch, beam), float("-inf"), device=source.device)
        for b in range(batch):
            kept = 0
            candidates = zip(top[b].tolist(), origin[b].tolist(), word[b].tolist(), strict=True)
            for rank, (score, o, w) in enumerate(candidates):
                row = tokens[b * beam + o]
                if score == float("-inf"):
                    break
                if w == eos or length == max_length:
                    if rank < beam and len(finished[b]) < beam:  # as fairseq: only the top beam candidates end
                        ids = row[1:].tolist() + ([] if w == eos else [w])
                        final = normalized(score, length, length_penalty, length_const)
                        if attention is not None:
                            final += coverage_penalty(attention[b * beam + o], coverage)
                        finished[b].append((final, ids))
                    continue
                if kept < beam:
                    next_tokens.append(torch.cat([row, row.new_tensor([w])]))
                    origins.append(b * beam + o)
                    next_scores[b, kept] = score
                    kept += 1
            for _ in range(kept, beam):  # a sentence with fewer live hypotheses: dead padding rows
                next_tokens.append(torch.cat([tokens[b * beam], tokens.new_tensor([eos])]))
                origins.append(b * beam)
        if all(len(f) >= beam for f in finished):
            break
        tokens, scores = torch.stack(next_tokens), next_scores
        scorer.survivors(origins)
    return [sorted(f, key=lambda h: h[0], reverse=True) for f in finished]
