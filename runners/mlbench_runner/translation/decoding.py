"""Greedy and beam search over :class:`~.transformer.Transformer`, as fairseq's SequenceGenerator scores them.

A hypothesis's score is the sum of its tokens' log-probabilities (eos included) divided by its length to the
power ``length_penalty`` (fairseq's ``--lenpen``; 1.0 is the mean per token, 0.0 the raw sum). Each step runs
the decoder over the whole prefix (no incremental state): simple, and exact.
"""

from __future__ import annotations

import torch

from mlbench_runner.translation.transformer import Transformer


def next_token_logits(
    model: Transformer, tokens: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor
) -> torch.Tensor:
    """fp32 logits of the token after ``tokens``; pad and bos are never generated (fairseq masks them too)."""
    logits = model.decode(tokens, memory, padding)[:, -1].float()
    logits[:, model.pad] = float("-inf")
    logits[:, tokens[0, 0]] = float("-inf")  # every prefix starts with bos
    return logits


@torch.no_grad()
def greedy(model: Transformer, source: torch.Tensor, *, bos: int, eos: int, max_length: int) -> list[list[int]]:
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


def normalized(score: float, length: int, length_penalty: float) -> float:
    """A finished hypothesis's score: its log-probability over length**length_penalty (length counts eos)."""
    return score / (length**length_penalty)


@torch.no_grad()
def beam_search(
    model: Transformer,
    source: torch.Tensor,
    *,
    bos: int,
    eos: int,
    max_length: int,
    beam: int,
    length_penalty: float = 1.0,
) -> list[list[int]]:
    """The best hypothesis per sentence among ``beam`` kept at each step; eos is not returned.

    At each step every live hypothesis extends by its ``beam`` best tokens (``2 * beam`` candidates per sentence,
    as fairseq, so that ``beam`` survive when some end); a candidate among the best ``beam`` that ends in eos is
    finished with its normalised score, the best ``beam`` others go on. A sentence is done once it has ``beam``
    finished hypotheses (fairseq's default early stop); at ``max_length`` the best live ones finish as they are.
    The caller puts the model in eval mode.
    """
    batch = source.shape[0]
    memory, padding = model.encode(source)
    memory = memory.repeat_interleave(beam, dim=0)
    padding = padding.repeat_interleave(beam, dim=0)
    tokens = torch.full((batch * beam, 1), bos, dtype=torch.long, device=source.device)
    scores = torch.zeros(batch, beam, device=source.device)
    scores[:, 1:] = float("-inf")  # all beams start equal: keep one, or the first step picks one token beam times
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    for length in range(1, max_length + 1):
        logp = torch.log_softmax(next_token_logits(model, tokens, memory, padding), dim=-1)
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
                        finished[b].append((normalized(score, length, length_penalty), ids))
                    continue
                if kept < beam:
                    next_tokens.append(torch.cat([row, row.new_tensor([w])]))
                    next_scores[b, kept] = score
                    kept += 1
            for _ in range(kept, beam):  # a sentence with fewer live hypotheses: dead padding rows
                next_tokens.append(torch.cat([tokens[b * beam], tokens.new_tensor([eos])]))
        if all(len(f) >= beam for f in finished):
            break
        tokens, scores = torch.stack(next_tokens), next_scores
    return [max(f, key=lambda h: h[0])[1] if f else [] for f in finished]
