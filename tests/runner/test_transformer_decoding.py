"""The Transformer's step decoding (task 4b): one token at a time from the cached keys and values gives the whole
prefix's logits; the cache follows the beam's reorder; the incremental beam search finds the whole-prefix search's
hypotheses with its scores (random weights, several beams, length normalisation on)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from mlbench_runner.translation.decoding import Stepping, beam_search, nbest
from mlbench_runner.translation.transformer import Transformer, TransformerShape
from mlbench_runner.translation.transformer_cache import DecoderCache

VOCAB, PAD, BOS, EOS = 24, 0, 1, 2
TINY = TransformerShape(d_model=32, heads=4, ffn=64, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64)


def tiny(seed: int, norm_first: bool = False) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(VOCAB, PAD, dataclasses.replace(TINY, norm_first=norm_first)).eval()


def sources() -> torch.Tensor:
    """Three right-padded sentences of different lengths (ids 4.. are words)."""
    return torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 12, 2, PAD, PAD], [13, 2, PAD, PAD, PAD, PAD]])


#: A different prefix per row of sources(), bos first, no pad.
PREFIXES = torch.tensor([[BOS, 5, 6, 7, 8, 9, 10], [BOS, 11, 12, 13, 4, 2, 14], [BOS, 3, 3, 4, 15, 16, 17]])


@pytest.mark.parametrize("norm_first", [False, True])
@torch.no_grad()
def test_decoding_one_token_at_a_time_is_decoding_the_whole_prefix(norm_first: bool) -> None:
    model = tiny(0, norm_first)
    memory, padding = model.encode(sources())
    whole = model.decode(PREFIXES, memory, padding)
    state = None
    for t in range(PREFIXES.shape[1]):
        step, attention, state = model.decode_step(PREFIXES[:, t : t + 1], memory, padding, state)
        assert attention is None
        torch.testing.assert_close(step[:, 0], whole[:, t], rtol=1e-5, atol=1e-5)
    assert state is not None
    assert state.length == PREFIXES.shape[1]
    first, _, cached = model.decode_step(PREFIXES[:, :4], memory, padding, None)  # several tokens: causal inside
    rest, _, _ = model.decode_step(PREFIXES[:, 4:], memory, padding, cached)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), whole, rtol=1e-5, atol=1e-5)


def _layers_reordered(state: DecoderCache, rows: torch.Tensor, *, own: bool, source: bool) -> DecoderCache:
    """``state`` with only the self-attention cache (own) or only the encoder keys/values (source) reordered."""
    layers = []
    for layer in state.layers:
        moved = layer.reorder(rows)
        layers.append(
            dataclasses.replace(
                layer,
                **({"keys": moved.keys, "values": moved.values} if own else {}),
                **({"memory_keys": moved.memory_keys, "memory_values": moved.memory_values} if source else {}),
            )
        )
    return DecoderCache(tuple(layers), state.length)


@torch.no_grad()
def test_the_cache_follows_the_beams_reorder() -> None:
    """After a reorder (survivors 2, 0, 0: one row dropped, one doubled, as a beam does) the next step gives the
    logits of the reordered prefixes decoded whole; a reorder that moves only part of the cache does not."""
    model = tiny(1)
    memory, padding = model.encode(sources())
    _, _, state = model.decode_step(PREFIXES[:, :5], memory, padding, None)
    rows = torch.tensor([2, 0, 0])
    prefixes = torch.cat([PREFIXES[rows, :5], torch.tensor([[7], [8], [9]])], dim=1)
    memory, padding = memory[rows], padding[rows]
    expected = model.decode(prefixes, memory, padding)[:, -1]
    step, _, _ = model.decode_step(prefixes[:, -1:], memory, padding, model.reorder(state, rows))
    torch.testing.assert_close(step[:, 0], expected, rtol=1e-5, atol=1e-5)
    for broken in (
        state,
        _layers_reordered(state, rows, own=True, source=False),
        _layers_reordered(state, rows, own=False, source=True),
    ):
        wrong, _, _ = model.decode_step(prefixes[:, -1:], memory, padding, broken)
        assert not torch.allclose(wrong[:, 0], expected, rtol=1e-3, atol=1e-3)


def _search(model: Transformer, beam: int, length_penalty: float, incremental: bool) -> list[Any]:
    return nbest(
        model, sources(), bos=BOS, eos=EOS, max_length=12, beam=beam, length_penalty=length_penalty,
        incremental=incremental,
    )  # fmt: skip


def _assert_same(found: list[Any], expected: list[Any]) -> None:
    assert [[ids for _, ids in sentence] for sentence in found] == [[ids for _, ids in s] for s in expected]
    for sentence, reference in zip(found, expected, strict=True):
        assert [score for score, _ in sentence] == pytest.approx([score for score, _ in reference], abs=1e-5)


#: Seeds (and norm placement) whose random models end hypotheses at different lengths, so the length
#: normalisation decides between them.
MODELS = [(0, False), (3, True), (7, True), (11, False)]


@pytest.mark.parametrize(("seed", "norm_first"), MODELS)
@pytest.mark.parametrize(("beam", "length_penalty"), [(1, 0.6), (2, 0.6), (4, 0.6), (5, 1.0)])
def test_the_incremental_search_finds_the_whole_prefix_searchs_hypotheses_and_scores(
    seed: int, norm_first: bool, beam: int, length_penalty: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny(seed, norm_first)
    assert isinstance(model, Stepping)
    whole = _search(model, beam, length_penalty, incremental=False)

    def no_whole_prefix(*args: object) -> torch.Tensor:
        raise AssertionError("the incremental search re-ran the decoder over the prefix")

    monkeypatch.setattr(model, "decode", no_whole_prefix)
    _assert_same(_search(model, beam, length_penalty, incremental=True), whole)
    assert all(len(sentence) == beam for sentence in whole)
    assert beam == 1 or len({len(ids) for sentence in whole for _, ids in sentence}) > 1


def test_the_search_test_needs_the_reorder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inputs above exercise the reorder: with a cache that never follows the survivors the incremental search
    finds other hypotheses (or scores) than the whole-prefix search."""
    model = tiny(0)
    whole = _search(model, 4, 0.6, incremental=False)
    monkeypatch.setattr(Transformer, "reorder", staticmethod(lambda state, rows: state))
    with pytest.raises(AssertionError):
        _assert_same(_search(model, 4, 0.6, incremental=True), whole)


@pytest.mark.parametrize("incremental", [False, True])
def test_the_transformer_has_no_coverage_penalty(incremental: bool) -> None:
    with pytest.raises(ValueError, match="coverage penalty"):
        beam_search(tiny(0), sources(), bos=BOS, eos=EOS, max_length=4, beam=2, coverage=0.1, incremental=incremental)
