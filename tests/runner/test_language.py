"""Task 3a's pieces: the token-file loader on small files in WikiText's format, the per-rank split, the synthetic
corpus (NOT WikiText-2), the page's BPTT length rule, rates, the averaged-SGD switch, AR/TAR, the parameter average,
the AWD-LSTM's dropouts, and perplexity as exp of the mean token NLL with the state carried across windows."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mlbench_api.catalog import get_task
from mlbench_runner.comm import LocalCommunicator
from mlbench_runner.goals import perplexity
from mlbench_runner.language.corpus import (
    EOS,
    UNK,
    batchify,
    build_vocabulary,
    read_corpus,
    read_tokens,
    split_file,
    write_synthetic,
)
from mlbench_runner.language.loop import RECIPE_3A, EpochScore, LanguageRecipe, LanguageResult, evaluate, report
from mlbench_runner.language.model import AwdLstm, AwdLstmShape
from mlbench_runner.language.rules import (
    ParameterAverage,
    activation_regularization,
    batch_rate,
    sequence_lengths,
    switch_to_averaging,
    temporal_activation_regularization,
    warmed_rate,
)
from mlbench_runner.language.task import recipe_for
from mlbench_runner.metrics import RunnerMetrics

from .helpers import make_config

TRAIN = " \n = Cats = \n \n the cat sat . \n the dog sat on the cat . \n <unk> ran \n"


def write_files(root: Path, train: str = TRAIN, valid: str = " the cat ran \n", test: str = " the dog \n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        split_file(root, split).write_text(text, encoding="utf-8")
    return root


# -- the loader ---------------------------------------------------------------------------------------------------
def test_the_vocabulary_is_the_training_files_words_in_order_with_eos_per_line(tmp_path: Path) -> None:
    root = write_files(tmp_path)
    vocab = build_vocabulary(split_file(root, "train"))
    assert vocab.words == (EOS, "=", "Cats", "the", "cat", "sat", ".", "dog", "on", UNK, "ran")
    ids = read_tokens(split_file(root, "train"), vocab).ids
    assert ids.numel() == 16 + 6  # 16 words and one <eos> for each of the 6 lines, blank ones included
    assert [vocab.words[i] for i in ids[:6]] == [EOS, "=", "Cats", "=", EOS, EOS]


def test_a_word_training_lacks_is_unk_and_counted(tmp_path: Path) -> None:
    root = write_files(tmp_path, valid=" the horse ran \n", test=" a cat \n")
    corpus = read_corpus(root)
    assert [corpus.vocab.words[i] for i in corpus.valid] == ["the", UNK, "ran", EOS]
    assert corpus.unknown == 2  # horse, a


def test_without_unk_in_training_an_unknown_word_is_refused_by_name(tmp_path: Path) -> None:
    root = write_files(tmp_path, train=" the cat \n", valid=" the dog \n")
    with pytest.raises(ValueError, match=r"wiki.valid.tokens:1: 'dog' is not in the training vocabulary"):
        read_corpus(root)


def test_a_missing_token_file_is_named(tmp_path: Path) -> None:
    root = write_files(tmp_path)
    split_file(root, "test").unlink()
    with pytest.raises(FileNotFoundError, match=r"wiki\.test\.tokens is missing"):
        read_corpus(root)


def test_batchify_gives_each_rank_its_contiguous_streams_and_drops_the_remainder() -> None:
    ids = torch.arange(23)
    alone = batchify(ids, 4)
    assert alone.shape == (5, 4)
    assert alone[:, 1].tolist() == [5, 6, 7, 8, 9]  # stream 1 is the second fifth of the corpus
    ranks = [batchify(ids, 2, r, 2) for r in (0, 1)]
    assert torch.equal(torch.cat(ranks, dim=1), alone)  # k ranks of b streams = one rank of k*b
    with pytest.raises(ValueError, match="cannot fill 20 streams"):
        batchify(ids, 10, 0, 2)


def test_the_synthetic_corpus_is_deterministic_and_in_wikitext_format(tmp_path: Path) -> None:
    lines = {"train": 300, "valid": 40, "test": 40}
    a = write_synthetic(tmp_path / "a", lines, seed=3)
    b = write_synthetic(tmp_path / "b", lines, seed=3)
    c = write_synthetic(tmp_path / "c", lines, seed=4)
    text = split_file(a, "train").read_text()
    assert text == split_file(b, "train").read_text() != split_file(c, "train").read_text()
    assert len(text.splitlines()) == 300
    assert any(line.startswith(" = ") and line.endswith(" = ") for line in text.splitlines())
    corpus = read_corpus(a)
    assert 30 < len(corpus.vocab) < 80
    assert UNK in corpus.vocab.words


# -- the rules ----------------------------------------------------------------------------------------------------
def test_fixed_windows_cover_the_stream_with_a_short_last_one() -> None:
    assert sequence_lengths(16, 7, None) == [7, 7, 1]  # 15 targets
    assert sequence_lengths(15, 7, None) == [7, 7]


def test_the_random_length_rule_is_the_pages() -> None:
    rng = random.Random(0)
    lengths = sequence_lengths(2_000_000, 70, rng)
    assert sum(lengths) == 2_000_000 - 1
    body = lengths[:-1]
    short = [n for n in body if n < 52]  # half windows: Normal(35, 5); full ones: Normal(70, 5)
    assert 0.04 < len(short) / len(body) < 0.06
    full = [n for n in body if n >= 52]
    assert 69.0 < statistics.mean(full) < 70.0  # int() truncates: mean 69.5
    assert 4.5 < statistics.stdev(full) < 5.5
    assert min(lengths[:-1]) >= 5
    assert sequence_lengths(10_000, 70, random.Random(5)) == sequence_lengths(10_000, 70, random.Random(5))


def test_the_random_length_rule_has_its_floor_and_its_half_window() -> None:
    assert set(sequence_lengths(1000, 3, random.Random(1), std=0.0)[:-1]) == {5}  # max(min_length, 3)
    half = sequence_lengths(1000, 70, random.Random(1), short_probability=1.0, std=0.0)
    assert set(half[:-1]) == {35}


def test_the_rate_scales_with_the_window_and_warms_up_to_sqrt_k() -> None:
    assert batch_rate(30.0, 35, 70) == 15.0
    assert warmed_rate(30.0, 1, 0.0) == 30.0
    assert warmed_rate(30.0, 4, 0.0) == 30.0
    assert warmed_rate(30.0, 4, 6.0) == pytest.approx(45.0)  # halfway through 4 * 3 epochs to 60
    assert warmed_rate(30.0, 4, 12.0) == pytest.approx(60.0)
    assert warmed_rate(30.0, 4, 100.0) == pytest.approx(60.0)


@pytest.mark.parametrize(
    ("previous", "current", "switch"),
    [
        ([], 9.0, False),
        ([5.0, 4.0, 3.0, 2.9, 2.8], 9.0, False),  # not more than nonmono evaluations yet
        ([5.0, 3.0, 3.2, 3.3, 3.1, 3.4, 3.5], 3.05, True),  # worse than the best before the last five
        ([5.0, 3.0, 3.2, 3.3, 3.1, 3.4, 3.5], 2.95, False),  # improved on it
        ([5.0, 3.0, 3.2, 3.3, 3.1, 3.4], 3.05, False),  # the best before the last five is 5.0
        ([5.0, 3.0, 3.2, 3.3, 3.1, 2.0, 3.5], 3.05, True),  # a better recent epoch (2.0) does not count: NT-ASGD's rule
    ],
)
def test_the_switch_to_averaged_sgd(previous: list[float], current: float, switch: bool) -> None:
    assert switch_to_averaging(previous, current, 5) is switch


def test_ar_and_tar_are_the_mean_squares_of_the_output_and_of_its_time_differences() -> None:
    dropped = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]]])  # (time 2, batch 1, width 2)
    assert float(activation_regularization(dropped, 2.0)) == pytest.approx(2.0 * 30 / 4)
    raw = torch.tensor([[[0.0, 0.0]], [[1.0, 2.0]], [[3.0, 5.0]]])
    assert float(temporal_activation_regularization(raw, 1.0)) == pytest.approx((1 + 4 + 4 + 9) / 4)
    assert float(temporal_activation_regularization(raw, 0.0)) == 0.0


def test_the_parameter_average_is_the_mean_since_the_switch_and_swaps_back() -> None:
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    avg = ParameterAverage()
    avg.update([p])  # not started: no effect
    assert not avg.active
    avg.start([p])
    for value in ([3.0, 2.0], [5.0, 8.0]):
        with torch.no_grad():
            p.copy_(torch.tensor(value))
        avg.update([p])
    assert avg.average is not None
    assert avg.average[0].tolist() == [3.0, 4.0]
    avg.swap([p])
    assert p.tolist() == [3.0, 4.0]
    avg.swap([p])
    assert p.tolist() == [5.0, 8.0]


# -- the model and the metric -------------------------------------------------------------------------------------
SMALL = AwdLstmShape(embedding=8, hidden=12, layers=3, weight_drop=0.5)


def test_weight_drop_masks_the_hidden_weights_in_training_only_and_trains_the_raw_matrix() -> None:
    torch.manual_seed(0)
    model = AwdLstm(20, SMALL)
    words = torch.randint(0, 20, (6, 3))
    model.eval()
    a, b = model(words, model.init_hidden(3)).logits, model(words, model.init_hidden(3)).logits
    assert torch.equal(a, b)
    model.train()
    c = model(words, model.init_hidden(3))
    d = model(words, model.init_hidden(3))
    assert not torch.equal(c.logits, d.logits)
    F.cross_entropy(c.logits, words.reshape(-1)).backward()
    rnn = model.rnns[0]
    assert isinstance(rnn, torch.nn.LSTM)
    grad = rnn.get_parameter("weight_hh_l0").grad
    assert grad is not None
    assert float(grad.abs().sum()) > 0
    assert model.decoder.weight is model.encoder.weight  # tied


def test_perplexity_is_exp_of_the_mean_nll_with_the_state_carried_across_windows() -> None:
    """Windows of 7 with the state carried give the NLL of one pass over each whole evaluation stream."""
    torch.manual_seed(1)
    model = AwdLstm(20, SMALL).double()
    ids = torch.randint(0, 20, (203,))
    recipe = LanguageRecipe(shape=SMALL, bptt=7, eval_batch=4)
    nll = evaluate(model, ids, recipe, LocalCommunicator("gloo"))
    streams = batchify(ids, 4)
    model.eval()
    with torch.no_grad():
        out = model(streams[:-1], model.init_hidden(4))
        whole = F.cross_entropy(out.logits, streams[1:].reshape(-1)).item()
    assert nll == pytest.approx(whole, rel=1e-9)
    assert perplexity(nll) == pytest.approx(math.exp(whole))
    assert 10 < perplexity(nll) < 30  # an untrained model is about uniform over 20 words


def test_the_catalog_3a_task_is_the_recipe() -> None:
    config = make_config(get_task("wikitext2-awd-lstm").spec.to_api(), Path("/tmp/unused"), 4)
    recipe = recipe_for(config)
    assert recipe == dataclasses.replace(RECIPE_3A, goal=recipe.goal)
    assert (recipe.goal.metric.value, recipe.goal.target) == ("perplexity", 68.6)


def test_the_reference_model_on_wikitext2s_vocabulary_has_the_papers_33m_parameters() -> None:
    """WikiText-2's 33278 words, the default shape: the AWD-LSTM paper lists 33M parameters for it (tied weights
    counted once)."""
    model = AwdLstm(33278, AwdLstmShape())
    count = sum(p.numel() for p in model.parameters())
    assert count == 33278 * 400 + 33278 + 4 * 1150 * (400 + 1150 + 2) + 4 * 1150 * (2 * 1150 + 2) + 4 * 400 * (
        1150 + 400 + 2
    )
    assert 33_000_000 < count < 34_000_000


def test_an_epochs_report_feeds_the_runners_metrics() -> None:
    metrics = RunnerMetrics("r", "t", "gloo", world_size=1, algorithm="allreduce-sgd", rank=0)
    record = EpochScore(epoch=2, score=71.25, nll=math.log(71.25), loss=4.3, averaging=False, wall_seconds=3.0)
    result = LanguageResult(history=[record], tokens=600, compute_seconds=2.0, communication_seconds=1.0)
    report(metrics, None, record, result, goal=RECIPE_3A.goal, met=False)
    sample = metrics.registry.get_sample_value
    assert sample("mlbench_score") == 71.25  # the perplexity: the SCORE column's figure
    assert (sample("mlbench_epoch"), sample("mlbench_loss"), sample("mlbench_goal_reached")) == (2, 4.3, 0)
    assert sample("mlbench_samples_per_second") == 200.0
