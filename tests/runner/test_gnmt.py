"""Task 4a's pieces: GNMT (shapes, normalized attention, the packed bidirectional layer, causality), its schedule,
GNMT's length normalisation and coverage penalty, beam 1 against greedy, sentence batches, clipping and the loss
scaler's ceiling (single process; the two-rank smoke run is in test_translation_ranks.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from mlbench_runner.comm import LocalCommunicator
from mlbench_runner.translation.decoding import beam_search, coverage_penalty, greedy, nbest, normalized
from mlbench_runner.translation.gnmt import Gnmt, GnmtShape
from mlbench_runner.translation.optim import (
    LossScaler,
    MicroBatch,
    accumulated_step,
    clipped,
    exponential_warmup_step_decay,
    sentence_batches,
)
from mlbench_runner.translation.transformer import shift_right

TINY = GnmtShape(hidden=16, layers=3, dropout=0.0)
VOCAB, PAD = 13, 0
ALONE = LocalCommunicator("gloo")


def tiny_gnmt(seed: int = 0) -> Gnmt:
    torch.manual_seed(seed)
    return Gnmt(VOCAB, PAD, TINY).eval()


def sources() -> torch.Tensor:
    """Two right-padded sentences (ids 4.. are words, 2 is eos)."""
    return torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, PAD, PAD]])


# -- the schedule -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "rate"),
    [
        (0, 2e-5),  # 0.01 * peak
        (100, 2e-4),  # halfway up the exponential: 0.1 * peak
        (200, 2e-3),  # the peak at warmup
        (399, 2e-3),  # flat until 40 % of 1000 steps
        (400, 1e-3),  # the first halving
        (449, 1e-3),
        (450, 5e-4),  # every 5 % (50 steps) another
        (500, 2.5e-4),
        (550, 1.25e-4),  # the fourth and last
        (600, 1.25e-4),
        (999, 1.25e-4),
    ],
)
def test_the_4a_schedule_warms_up_exponentially_then_halves_at_most_four_times(step: int, rate: float) -> None:
    assert math.isclose(exponential_warmup_step_decay(step, 1000, peak=2e-3, warmup=200), rate, rel_tol=1e-9)


def test_a_short_run_warms_up_no_longer_than_its_decay_start() -> None:
    """With 100 steps the decay starts at step 40: the warm-up ends there at the peak (the reference's rule), the
    first halving follows, and an interval of 5 % is 5 steps."""
    rates = [exponential_warmup_step_decay(s, 100, peak=1.0, warmup=200) for s in range(100)]
    assert rates[0] == pytest.approx(0.01)
    assert rates[40] == 1.0
    assert rates[41] == 0.5
    assert rates[45] == 0.25
    assert rates[99] == 1.0 / 16


# -- the model ----------------------------------------------------------------------------------------------------


def test_gnmt_shapes_and_its_residual_stack() -> None:
    model = tiny_gnmt()
    previous = torch.tensor([[1, 5, 6], [1, 9, 2]])
    memory, padding = model.encode(sources())
    logits, attention = model.decode_attention(previous, memory, padding)
    assert memory.shape == (2, 5, 16)
    assert logits.shape == (2, 3, VOCAB)
    assert attention.shape == (2, 3, 5)
    assert torch.equal(model(sources(), previous), logits)
    assert model.encoder[0].bidirectional
    assert not model.encoder[1].bidirectional
    assert [m.input_size for m in model.encoder] == [16, 32, 16]  # the bidirectional layer's output is 2 * hidden
    assert [m.input_size for m in model.decoder] == [32, 32]  # each reads the attention context beside its input
    assert model.embed_source is model.embed_target  # the shared embedding


def test_attention_is_a_distribution_over_the_real_source_tokens() -> None:
    memory, padding = tiny_gnmt().encode(sources())
    _, attention = tiny_gnmt().decode_attention(torch.tensor([[1, 5], [1, 9]]), memory, padding)
    torch.testing.assert_close(attention.sum(-1), torch.ones(2, 2))
    assert torch.all(attention[1, :, 3:] == 0)  # the pads get nothing
    assert torch.all(attention[1, :, :3] > 0)


def test_the_attention_vector_is_normalized() -> None:
    """The score uses g * v / |v|: scaling v leaves the model unchanged, scaling g does not."""
    model = tiny_gnmt()
    previous = torch.tensor([[1, 5, 6], [1, 9, 2]])
    before = model(sources(), previous)
    with torch.no_grad():
        model.attention.linear_att.mul_(7.0)
    torch.testing.assert_close(model(sources(), previous), before)
    with torch.no_grad():
        model.attention.normalize_scalar.mul_(7.0)
    assert not torch.allclose(model(sources(), previous), before)
    assert float(model.attention.normalize_scalar.detach()) == pytest.approx(7.0 / math.sqrt(16))


def test_the_bidirectional_layer_ignores_padding() -> None:
    """The short sentence encodes alike alone and padded in a batch (the backward half starts at its eos)."""
    model = tiny_gnmt()
    batch, _ = model.encode(sources())
    alone, _ = model.encode(sources()[1:, :3])
    torch.testing.assert_close(batch[1, :3], alone[0], rtol=1e-5, atol=1e-6)


def test_the_gnmt_decoder_is_causal() -> None:
    model = tiny_gnmt()
    a = model(sources(), torch.tensor([[1, 5, 6, 7]]).expand(2, -1))
    b = model(sources(), torch.tensor([[1, 5, 11, 12]]).expand(2, -1))
    torch.testing.assert_close(a[:, :2], b[:, :2])
    assert not torch.allclose(a[:, 2:], b[:, 2:])


def test_gnmt_needs_two_layers() -> None:
    with pytest.raises(ValueError, match="layers must be at least 2"):
        Gnmt(VOCAB, PAD, GnmtShape(hidden=8, layers=1))


# -- decoding -----------------------------------------------------------------------------------------------------


def test_gnmts_length_normalisation() -> None:
    assert normalized(-6.0, 1, 0.6, 5.0) == -6.0  # (5 + 1) / 6 = 1
    assert normalized(-6.0, 7, 0.6, 5.0) == pytest.approx(-6.0 / 2.0**0.6)
    assert normalized(-6.0, 4, 1.0) == -1.5  # fairseq's without a constant


def test_gnmts_coverage_penalty() -> None:
    """weight * sum_j log(min(1, attention received by j)); a source token that got nothing counts 0."""
    attention = torch.tensor([[0.75, 0.25, 0.0, 0.0], [0.5, 0.25, 0.25, 0.0]])  # steps x source tokens
    assert coverage_penalty(attention, 0.1) == pytest.approx(0.1 * (0.0 + math.log(0.5) + math.log(0.25)))
    assert coverage_penalty(attention, 0.0) == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gnmt_beam_search_with_beam_one_is_greedy(seed: int) -> None:
    model = tiny_gnmt(seed)
    kwargs: dict[str, Any] = {"bos": 1, "eos": 2, "max_length": 9}
    expected = greedy(model, sources(), **kwargs)
    beam = beam_search(model, sources(), beam=1, length_penalty=0.6, length_const=5.0, coverage=0.1, **kwargs)
    assert beam == expected
    assert any(len(h) > 0 for h in expected)


def test_gnmt_decoding_one_token_at_a_time_is_decoding_the_whole_prefix() -> None:
    """decode_step from the state the earlier tokens left gives the whole prefix's logits and attention, step by
    step; reorder picks the rows' states."""
    model = tiny_gnmt(4)
    memory, padding = model.encode(sources())
    previous = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 4]])
    logits, weights = model.decode_attention(previous, memory, padding)
    state = None
    for t in range(previous.shape[1]):
        step_logits, step_weights, state = model.decode_step(previous[:, t : t + 1], memory, padding, state)
        torch.testing.assert_close(step_logits[:, 0], logits[:, t], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(step_weights[:, 0], weights[:, t], rtol=1e-5, atol=1e-6)
    assert state is not None
    swapped = model.reorder(state, torch.tensor([1, 0]))
    assert len(swapped) == len(state) == 3  # the attention LSTM and the two decoder layers
    for (h, c), (h0, c0) in zip(swapped, state, strict=True):
        assert torch.equal(h[:, 0], h0[:, 1])
        assert torch.equal(c[:, 1], c0[:, 0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gnmt_incremental_beam_search_finds_what_the_whole_prefix_search_finds(seed: int) -> None:
    model = tiny_gnmt(seed)
    kwargs: dict[str, Any] = {"bos": 1, "eos": 2, "max_length": 9, "beam": 5, "length_penalty": 0.6}
    for coverage in (0.0, 0.1):
        whole = nbest(model, sources(), length_const=5.0, coverage=coverage, incremental=False, **kwargs)
        found = nbest(model, sources(), length_const=5.0, coverage=coverage, **kwargs)
        assert [[ids for _, ids in s] for s in found] == [[ids for _, ids in s] for s in whole]
        for sentence, reference in zip(found, whole, strict=True):
            assert [score for score, _ in sentence] == pytest.approx([score for score, _ in reference], abs=1e-5)
        assert any(ids for sentence in whole for _, ids in sentence)


def test_gnmt_beam_search_with_coverage_returns_one_hypothesis_per_sentence() -> None:
    model = tiny_gnmt(3)
    out = beam_search(
        model, sources(), bos=1, eos=2, max_length=9, beam=5, length_penalty=0.6, length_const=5.0, coverage=0.1
    )
    assert len(out) == 2
    assert all(len(h) <= 9 and 2 not in h and PAD not in h for h in out)


# -- batches, clipping, the scaler ----------------------------------------------------------------------------------


def test_sentence_batches_cover_every_sentence_in_length_order() -> None:
    lengths = [5, 1, 4, 1, 3, 9, 2]
    batches = sentence_batches(lengths, 3)
    assert [len(b) for b in batches] == [3, 3, 1]
    assert sorted(i for b in batches for i in b) == list(range(7))
    assert [lengths[i] for b in batches for i in b] == sorted(lengths)


def test_clipping_caps_the_global_norm() -> None:
    torch.testing.assert_close(clipped(torch.tensor([3.0, 4.0]), 1.0), torch.tensor([0.6, 0.8]), atol=1e-6, rtol=0)
    assert torch.equal(clipped(torch.tensor([3.0, 4.0]), 5.0), torch.tensor([3.0, 4.0]))


def test_the_loss_scaler_grows_no_higher_than_its_ceiling() -> None:
    scaler = LossScaler(scale=2.0**10, window=2, max_scale=2.0**11)
    for _ in range(6):
        assert scaler.update(overflow=False)
    assert scaler.scale == 2.0**11
    assert not scaler.update(overflow=True)
    assert (scaler.scale, scaler.skipped) == (2.0**10, 1)


def sgd_delta(per_sentence: bool, clip_norm: float | None) -> tuple[torch.Tensor, int, int]:
    """The flat update of one SGD(lr 1) step through accumulated_step over two micro-batches, and the batch's
    target tokens and sentences."""
    model = tiny_gnmt().train()
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    target = torch.tensor([[4, 5, 2], [6, 2, PAD]])
    batches = [MicroBatch(sources(), shift_right(target, 1, PAD), target)] * 2
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    outcome = accumulated_step(
        model, optimizer, batches, ALONE, LossScaler(), lr=1.0, pad=PAD, smoothing=0.1,
        per_sentence=per_sentence, clip_norm=clip_norm,
    )  # fmt: skip
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return before - after, outcome.tokens, outcome.sentences


def test_4as_gradient_is_the_mean_per_sentence_and_clipped() -> None:
    by_token, tokens, sentences = sgd_delta(per_sentence=False, clip_norm=None)
    by_sentence, _, _ = sgd_delta(per_sentence=True, clip_norm=None)
    assert (tokens, sentences) == (10, 4)
    torch.testing.assert_close(by_sentence * sentences, by_token * tokens, rtol=1e-4, atol=1e-6)
    capped, _, _ = sgd_delta(per_sentence=True, clip_norm=0.01)
    assert float(torch.linalg.vector_norm(by_sentence)) > 0.01
    assert float(torch.linalg.vector_norm(capped)) == pytest.approx(0.01, rel=1e-3)
