"""Task 4b's pieces: the synthetic pair and the raw-text format, decoding, BLEU, the schedule, the loss scaler
and the accumulated, loss-scaled optimizer step (single process; the multi-rank tests are in
test_translation_ranks.py)."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest
import sacrebleu
import torch

from mlbench_api.goal import Goal
from mlbench_api.model import ModelName
from mlbench_runner.comm import LocalCommunicator
from mlbench_runner.metrics import RunnerMetrics
from mlbench_runner.rank.train import KINDS
from mlbench_runner.schedule import warmup_inverse_sqrt
from mlbench_runner.translation.bleu import corpus_bleu
from mlbench_runner.translation.corpus import (
    build_vocabulary,
    pad_batch,
    read_dictionary,
    read_split,
    synthetic_corpus,
    token_batches,
    write_dictionary,
    write_synthetic,
)
from mlbench_runner.translation.decoding import beam_search, greedy
from mlbench_runner.translation.loop import SMOKE, gather_hypotheses, step_plan, train_translation
from mlbench_runner.translation.optim import (
    LossScaler,
    MicroBatch,
    accumulated_step,
    label_smoothed_loss,
    update_freq,
)
from mlbench_runner.translation.transformer import Transformer, TransformerShape, shift_right

ALONE = LocalCommunicator("gloo")
TINY = TransformerShape(d_model=32, heads=2, ffn=64, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=64)


# -- the synthetic pair and the format ----------------------------------------------------------------------------


def test_the_synthetic_pair_is_deterministic_and_seeded() -> None:
    assert synthetic_corpus(50, seed=3) == synthetic_corpus(50, seed=3)
    assert synthetic_corpus(50, seed=3) != synthetic_corpus(50, seed=4)


def test_the_synthetic_pair_agrees_and_reorders() -> None:
    """The verb goes last and agrees in number with the subject; adjectives follow their noun and agree with it."""
    nouns = {"dog", "cat", "house", "child", "man", "woman", "tree", "car", "book", "city", "bird", "door"}
    for en, de in synthetic_corpus(300, seed=1):
        subject = next(w for w in en.split() if w.removesuffix("s") in nouns)
        assert de.split()[-1].endswith("en" if subject.endswith("s") and subject not in nouns else "t"), (en, de)
    pairs = synthetic_corpus(5000, seed=2)
    for english, german in [("the red dog", "der hund roter"), ("some red dogs", "einige hunden roten"),
                            ("a small door", "eine tuer kleine"), ("the old house", "das haus altes")]:  # fmt: skip
        found = [de for en, de in pairs if en.startswith(english + " ")]
        assert found, english
        assert all(de.startswith(german + " ") for de in found), (english, found[:3])


def test_write_and_read_the_raw_text_format(tmp_path: Path) -> None:
    root = write_synthetic(tmp_path / "syn", {"train": 40, "test": 10}, seed=5)
    assert sorted(p.name for p in root.iterdir()) == ["dict.txt", "test.de", "test.en", "train.de", "train.en"]
    vocab = read_dictionary(root / "dict.txt")
    test = read_split(root, "test", vocab)
    assert len(test.source) == len(test.target) == 10
    assert [vocab.decode(t) for t in test.target] == test.references == (root / "test.de").read_text().splitlines()
    assert all(ids[-1] == vocab.eos for ids in test.source)
    assert vocab.unk not in {i for ids in test.source for i in ids}  # the dictionary covers every split


def test_a_fairseq_dictionary_and_bpe_text_as_written_by_hand(tmp_path: Path) -> None:
    """The real format on a small file: ``<token> <count>`` lines; tokens may carry BPE's ``@@``."""
    (tmp_path / "dict.txt").write_text("die 120\nKat@@ 7\nze 7\n. 300\n")
    (tmp_path / "test.en").write_text("the cat .\nthe the the the the the the the .\n")
    (tmp_path / "test.de").write_text("die Kat@@ ze .\ndie die die die die die die die die .\n")
    vocab = read_dictionary(tmp_path / "dict.txt")
    assert vocab.tokens[:4] == ("<pad>", "<s>", "</s>", "<unk>")
    assert vocab.encode("die Kat@@ ze .") == [4, 5, 6, 7, vocab.eos]
    short = read_split(tmp_path, "test", vocab, max_tokens=8)  # the second pair has 11 target tokens
    assert short.references == ["die Katze ."]  # BLEU's reference: BPE merged
    (tmp_path / "test.ref.de").write_text("Die Katze.\nDie die.\n")
    assert read_split(tmp_path, "test", vocab, max_tokens=8).references == ["Die Katze."]  # detokenized refs
    assert short.source[0] == [vocab.unk, vocab.unk, 7, vocab.eos]  # English is not in this German dictionary
    (tmp_path / "bad.txt").write_text("die\n")
    with pytest.raises(ValueError, match=r"bad\.txt:1: expected"):
        read_dictionary(tmp_path / "bad.txt")
    (tmp_path / "test.ref.de").unlink()
    (tmp_path / "test.de").write_text("die .\n")
    with pytest.raises(ValueError, match="2 en lines but 1 de lines"):
        read_split(tmp_path, "test", vocab)


def test_the_dictionary_round_trips(tmp_path: Path) -> None:
    vocab, counts = build_vocabulary(["a b b c", "c c"])
    write_dictionary(tmp_path / "dict.txt", vocab, counts)
    assert (tmp_path / "dict.txt").read_text() == "c 3\nb 2\na 1\n"
    assert read_dictionary(tmp_path / "dict.txt") == vocab


def test_token_batches_cover_every_sentence_within_the_token_budget() -> None:
    lengths = [random.Random(i).randint(1, 30) for i in range(200)]
    batches = token_batches(lengths, max_tokens=64)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(max(lengths[i] for i in b) * len(b) <= 64 for b in batches)


def test_the_step_plan_deals_each_step_out_to_the_ranks() -> None:
    batches = [[i] for i in range(10)]
    plans = [step_plan(batches, world=2, rank=r, freq=2, seed=1, epoch=0) for r in range(2)]
    assert [len(p) for p in plans] == [2, 2]  # 10 batches, 4 per step: 2 steps, 2 left over and dropped
    dealt = [b[0] for step in range(2) for r in range(2) for b in plans[r][step]]
    assert len(set(dealt)) == 8
    assert step_plan(batches, world=1, rank=0, freq=4, seed=1, epoch=0) == [
        plans[0][0] + plans[1][0],
        plans[0][1] + plans[1][1],
    ]  # one rank with the same global batch gets the same micro-batches per step


def test_gather_hypotheses_alone_keeps_the_order() -> None:
    assert gather_hypotheses(LocalCommunicator("gloo"), [[5, 6], [], [7]], 3, 4) == [[5, 6], [], [7]]


# -- the model and decoding ---------------------------------------------------------------------------------------


def tiny_model(vocab: int = 20, seed: int = 0, norm_first: bool = False) -> Transformer:
    torch.manual_seed(seed)
    shape = TransformerShape(**{**TINY.__dict__, "norm_first": norm_first})
    return Transformer(vocab, pad=0, shape=shape).eval()


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_decoder_is_causal(norm_first: bool) -> None:
    model = tiny_model(norm_first=norm_first)
    source = torch.tensor([[5, 6, 7, 2]])
    a = model(source, torch.tensor([[1, 8, 9, 10]]))
    b = model(source, torch.tensor([[1, 8, 11, 12]]))
    torch.testing.assert_close(a[:, :2], b[:, :2])
    assert not torch.allclose(a[:, 2], b[:, 2])


def test_shift_right_feeds_bos_and_keeps_pads() -> None:
    target = torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0]])
    assert shift_right(target, bos=1, pad=0).tolist() == [[1, 5, 6, 0], [1, 7, 0, 0]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_with_beam_one_is_greedy(seed: int) -> None:
    model = tiny_model(seed=seed)
    source = pad_batch([[random.Random(seed * 10 + i).randint(4, 19) for _ in range(3 + i)] + [2] for i in range(6)], 0)
    expected = greedy(model, source, bos=1, eos=2, max_length=12)
    assert beam_search(model, source, bos=1, eos=2, max_length=12, beam=1, length_penalty=0.6) == expected
    assert all(1 not in h and 0 not in h for h in expected)  # pad and bos are never generated


def test_beam_search_finds_a_likelier_sequence_than_greedy() -> None:
    """Without length normalisation, beam search's best is at least as likely as greedy's, both scored by the
    model's own summed log-probabilities."""

    def logprob(model: Transformer, source: torch.Tensor, ids: list[int]) -> float:
        target = torch.tensor([[*ids, 2]])
        logits = model(source, shift_right(target, 1, 0))
        logits[..., 0] = float("-inf")
        logits[..., 1] = float("-inf")
        return float(torch.log_softmax(logits.detach(), -1).gather(-1, target.unsqueeze(-1)).sum())

    compared = 0
    for seed in range(4):
        model = tiny_model(seed=seed)
        source = torch.tensor([[4 + seed, 9, 11, 2]])
        g = greedy(model, source, bos=1, eos=2, max_length=6)[0]
        b = beam_search(model, source, bos=1, eos=2, max_length=6, beam=4, length_penalty=0.0)[0]
        if len(g) < 6 and len(b) < 6:  # both ended on eos (a cut-off hypothesis has no eos to score)
            assert logprob(model, source, b) >= logprob(model, source, g) - 1e-5
            compared += 1
    assert compared


# -- BLEU -----------------------------------------------------------------------------------------------------------


def test_bleu_is_sacrebleus_on_the_same_hypotheses() -> None:
    refs = ["der hund sieht die katze .", "ein kleines haus steht dort .", "das ist gut ."]
    hyps = ["der hund sieht eine katze .", "ein haus steht dort .", "das ist gut ."]
    score = corpus_bleu(hyps, refs)
    assert score.score == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert 0 < score.score < 100
    assert score.signature == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    assert corpus_bleu(refs, refs).score == pytest.approx(100.0)
    with pytest.raises(ValueError, match="2 hypotheses for 3 references"):
        corpus_bleu(hyps[:2], refs)


# -- the recipe's rule ----------------------------------------------------------------------------------------------


def test_the_schedule_warms_up_linearly_then_decays_as_inverse_sqrt() -> None:
    assert warmup_inverse_sqrt(0, 1.976e-3, 1000) == 0.0
    assert warmup_inverse_sqrt(500, 1.976e-3, 1000) == pytest.approx(0.988e-3)
    assert warmup_inverse_sqrt(1000, 1.976e-3, 1000) == pytest.approx(1.976e-3)
    assert warmup_inverse_sqrt(4000, 1.976e-3, 1000) == pytest.approx(0.988e-3)


@pytest.mark.parametrize(("world", "freq"), [(1, 16), (2, 8), (8, 2), (16, 1), (32, 1)])
def test_update_freq_is_the_pages(world: int, freq: int) -> None:
    assert update_freq(2**17, 2**13, world) == freq


def test_the_loss_scaler_halves_on_overflow_and_doubles_after_a_clean_window() -> None:
    scaler = LossScaler(scale=128.0, factor=2.0, window=3)
    assert not scaler.update(overflow=True)
    assert (scaler.scale, scaler.skipped) == (64.0, 1)
    assert all(scaler.update(overflow=False) for _ in range(3))
    assert (scaler.scale, scaler.skipped, scaler.clean) == (128.0, 1, 0)


def test_label_smoothing_ignores_pads() -> None:
    logits = torch.randn(2, 3, 10)
    target = torch.tensor([[4, 5, 0], [6, 0, 0]])
    full = label_smoothed_loss(logits, target, pad=0, smoothing=0.1)
    kept = label_smoothed_loss(logits[:, :1], target[:, :1], pad=0, smoothing=0.1) + label_smoothed_loss(
        logits[:1, 1:2], target[:1, 1:2], pad=0, smoothing=0.1
    )
    torch.testing.assert_close(full, kept)


def micro_batches(seed: int, n: int, vocab: int = 20) -> list[MicroBatch]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        src = pad_batch([[rng.randint(4, vocab - 1) for _ in range(rng.randint(2, 7))] + [2] for _ in range(4)], 0)
        tgt = pad_batch([[rng.randint(4, vocab - 1) for _ in range(rng.randint(2, 7))] + [2] for _ in range(4)], 0)
        out.append(MicroBatch(src, shift_right(tgt, 1, 0), tgt))
    return out


def sgd_step(autocast: torch.dtype | None, scale: float) -> tuple[torch.Tensor, LossScaler, float]:
    model = tiny_model().train()
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = LossScaler(scale=scale)
    outcome = accumulated_step(
        model, optimizer, micro_batches(0, 3), LocalCommunicator("gloo"), scaler, lr=1.0, pad=0, smoothing=0.1,
        autocast=autocast,
    )  # fmt: skip
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return before - after, scaler, outcome.loss


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.bfloat16, 0.05), (torch.float16, 0.01)])
def test_a_loss_scaled_low_precision_step_matches_fp32(dtype: torch.dtype, tolerance: float) -> None:
    """The same SGD step (lr 1: the update is the deflated gradient) in fp32 and under autocast with the recipe's
    initial scale 2**7: within the low precision's tolerance, and not identical (the precision did change)."""
    exact, _, loss32 = sgd_step(None, 1.0)
    low, scaler, loss_low = sgd_step(dtype, 2.0**7)
    error = float((low - exact).norm() / exact.norm())
    assert 0 < error < tolerance
    assert loss_low == pytest.approx(loss32, rel=tolerance)
    assert scaler.skipped == 0


def test_an_overflowing_step_is_skipped_and_counted() -> None:
    update, scaler, _ = sgd_step(torch.float16, 2.0**200)  # the scaled loss is inf in fp32: the gradient too
    assert scaler.skipped == 1
    assert scaler.scale == 2.0**199
    assert float(update.abs().max()) == 0.0  # no parameter moved


def test_accumulation_equals_one_big_batch_alone() -> None:
    """Alone, four micro-batches accumulated take the step that one batch of all their sentences takes (fp64:
    Adam's first step is lr * sign(g) wherever |g| >> eps, so fp32 noise on a near-zero gradient would flip it)."""
    batches = micro_batches(1, 4)
    one = MicroBatch(
        pad_batch([r for b in batches for r in b.source.tolist()], 0),
        pad_batch([r for b in batches for r in b.previous.tolist()], 0),
        pad_batch([r for b in batches for r in b.target.tolist()], 0),
    )
    results = []
    for step in (batches, [one]):
        model = tiny_model().double().train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
        out = accumulated_step(model, optimizer, step, LocalCommunicator("gloo"), LossScaler(), lr=1e-3, pad=0,
                               smoothing=0.1)  # fmt: skip
        results.append((torch.cat([p.detach().reshape(-1) for p in model.parameters()]), out))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-9, atol=1e-9)
    assert results[0][1].tokens == results[1][1].tokens
    assert results[0][1].loss == pytest.approx(results[1][1].loss, rel=1e-5)
    assert math.isfinite(results[0][1].loss)


# -- the loop's goals -----------------------------------------------------------------------------------------------

QUICK = dataclasses.replace(
    SMOKE,
    shape=TransformerShape(d_model=32, heads=2, ffn=64, encoder_layers=1, decoder_layers=1, max_positions=64),
    max_epochs=3,
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("pair"), {"train": 400, "test": 40}, seed=0)


def test_a_loss_goal_stops_at_the_first_epoch_that_meets_it(pair: Path) -> None:
    probe = train_translation(pair, dataclasses.replace(QUICK, goal=Goal(metric="loss", target=1e3)), ALONE)
    assert probe.reached
    assert len(probe.history) == 1  # any loss meets 1000: stopped after epoch 1
    assert probe.history[0].bleu is None  # no decoding for a loss goal
    assert probe.history[0].score == probe.history[0].test_loss
    assert probe.time_to_goal == probe.history[0].wall_seconds
    never = train_translation(pair, dataclasses.replace(QUICK, goal=Goal(metric="perplexity", target=1.0001)), ALONE)
    assert not never.reached
    assert never.time_to_goal is None
    assert len(never.history) == QUICK.max_epochs
    assert [h.score for h in never.history] == pytest.approx([math.exp(h.test_loss) for h in never.history])
    assert never.history[-1].test_loss < never.history[0].test_loss  # it learns


def test_accuracy_after_time_is_judged_by_the_last_evaluation(pair: Path) -> None:
    goal = Goal(metric="loss", target=1e3, mode="accuracy-after-time", time_budget_seconds=1)
    recipe = dataclasses.replace(QUICK, goal=goal, max_epochs=50)
    result = train_translation(pair, recipe, ALONE)
    assert result.reached
    assert len(result.history) < 50  # the budget ended it, not the epochs
    assert result.time_to_goal == result.history[0].wall_seconds


def test_the_loop_feeds_the_runners_metrics(pair: Path) -> None:
    metrics = RunnerMetrics("r", "t", "gloo", world_size=1, algorithm="allreduce-sgd", rank=0)
    goal = Goal(metric="loss", target=1e-6)  # never met: every epoch runs
    result = train_translation(pair, dataclasses.replace(QUICK, goal=goal, max_epochs=2), ALONE, metrics=metrics)
    sample = metrics.registry.get_sample_value
    assert sample("mlbench_steps_total") == result.steps > 0
    assert sample("mlbench_samples_total") == result.tokens
    assert sample("mlbench_epoch") == 2
    assert sample("mlbench_goal_reached") == 0
    assert sample("mlbench_loss") == result.history[-1].loss
    assert sample("mlbench_score") == result.history[-1].score  # the goal metric's column (loss here)
    assert sample("mlbench_phase_seconds_total", {"phase": "communication"}) == pytest.approx(
        result.communication_seconds
    )


def test_every_model_the_api_knows_has_a_kind_in_the_runner() -> None:
    assert set(KINDS) == set(ModelName)
