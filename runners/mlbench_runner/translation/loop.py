"""One rank's translation training to a BLEU goal: the recipe's loop, flat.

Per epoch: the training sentences grouped into token-bounded micro-batches (4b, fairseq's ``--max-tokens``) or
micro-batches of a number of sentences (4a), shuffled alike on every rank, dealt out ``update_freq`` per rank per
optimizer step; each step is
:func:`~.optim.accumulated_step` (one all-reduce). After each epoch every rank decodes its share of the test
set with beam search, the hypotheses are gathered, and BLEU (sacrebleu, detokenized) decides the stop on every
rank alike.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mlbench_api.goal import Goal, GoalMetric, GoalMode
from mlbench_api.results import CommunicationRecord
from mlbench_runner.algorithms.base import DistributedAlgorithm
from mlbench_runner.algorithms.loop_step import StepBytes, counted_bytes
from mlbench_runner.comm import Communicator
from mlbench_runner.events import EventLog
from mlbench_runner.goals import epoch_score
from mlbench_runner.metrics import RunnerMetrics
from mlbench_runner.schedule import warmup_inverse_sqrt
from mlbench_runner.translation.algorithm_step import algorithm_step
from mlbench_runner.translation.bleu import corpus_bleu
from mlbench_runner.translation.corpus import (
    ParallelText,
    Vocabulary,
    merge_bpe,
    pad_batch,
    read_dictionary,
    read_split,
    token_batches,
)
from mlbench_runner.translation.decoding import Seq2Seq, beam_search
from mlbench_runner.translation.gnmt import Gnmt, GnmtShape
from mlbench_runner.translation.optim import (
    LossScaler,
    MicroBatch,
    StepOutcome,
    accumulated_step,
    exponential_warmup_step_decay,
    label_smoothed_loss,
    sentence_batches,
    update_freq,
)
from mlbench_runner.translation.transformer import BASE, Transformer, TransformerShape, shift_right

#: Sentences per decoding batch at evaluation.
DECODE_BATCH = 64
#: Optimizer steps between two checks of an accuracy-after-time budget (rank 0's clock, broadcast).
BUDGET_EVERY = 25


def bleu_goal(target: float, light: float | None = None) -> Goal:
    return Goal(metric=GoalMetric.BLEU, target=target, light_target=light)


@dataclass(frozen=True)
class StepDecay:
    """Task 4a's decay after the exponential warm-up: ``factor`` at ``start`` of the total steps, then every
    ``interval`` of them, at most ``max_decays`` times (:func:`~.optim.exponential_warmup_step_decay`)."""

    start: float = 0.4
    interval: float = 0.05
    max_decays: int = 4
    factor: float = 0.5


@dataclass(frozen=True)
class TranslationRecipe:
    """A translation task's hyperparameters; the defaults are task 4b's (the public page's, and mlbench-benchmarks'
    reference where the page is silent) but for the length normalisation (:data:`RECIPE_4B` sets the reference's
    constant), :data:`RECIPE_4A` is task 4a's."""

    shape: TransformerShape | GnmtShape = BASE
    global_tokens: int = 2**17  #: b, target tokens per optimizer step over all ranks
    max_tokens: int = 2**13  #: bs_max, tokens per micro-batch one device fits
    sentences_per_step: int | None = None  #: set: b counts sentences (4a), not tokens
    max_sentences: int = 128  #: bs_max in sentences, with sentences_per_step
    peak_lr: float = 1.976e-3
    warmup: int = 1000  #: optimizer steps of linear warm-up from 0
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    smoothing: float = 0.1
    initial_scale: float = 2.0**7
    scale_factor: float = 2.0
    scale_window: int = 2000
    max_scale: float = float("inf")
    max_length: int = 80  #: tokens per sentence (eos included), in training (and test unless test_max_length)
    test_max_length: int | None = None
    max_epochs: int = 10
    beam: int = 4
    length_penalty: float = 0.6
    length_const: float | None = None  #: GNMT's length normalisation constant (decoding.normalized)
    coverage: float = 0.0  #: GNMT's coverage penalty weight
    decay: StepDecay | None = None  #: set: 4a's exponential warm-up and step decay, else 4b's inverse-sqrt
    clip_norm: float | None = None  #: the deflated gradient's global norm cap
    goal: Goal = field(default_factory=lambda: bleu_goal(25.0, 20.0))  #: light 20 BLEU: the reference's

    def rate(self, step: int, total: int) -> float:
        """The rate of 0-based optimizer ``step`` out of ``total`` steps in ``max_epochs``."""
        if self.decay is None:
            return warmup_inverse_sqrt(step + 1, self.peak_lr, self.warmup)
        d = self.decay
        return exponential_warmup_step_decay(
            step, total, peak=self.peak_lr, warmup=self.warmup, decay_start=d.start, decay_interval=d.interval,
            max_decays=d.max_decays, factor=d.factor,
        )  # fmt: skip

    @property
    def longest_test(self) -> int:
        return self.test_max_length or self.max_length


#: Task 4b: the defaults, and the reference's length normalisation (mlbench-core's SequenceGenerator divides by
#: ((5 + length) / 6) ** 0.6, not fairseq's length ** 0.6; docs/tasks-translation.md).
RECIPE_4B = TranslationRecipe(length_const=5.0)
#: Task 4a (GNMT, WMT16 EN-DE): the page's recipe and the reference's decoding (docs/tasks-translation.md).
RECIPE_4A = TranslationRecipe(
    shape=GnmtShape(),
    sentences_per_step=2048,
    max_sentences=128,
    peak_lr=2e-3,
    warmup=200,
    betas=(0.9, 0.999),
    eps=1e-8,
    initial_scale=2.0**10,
    scale_window=128,
    max_scale=2.0**13,
    max_length=75,
    test_max_length=150,
    max_epochs=8,
    beam=5,
    length_penalty=0.6,
    length_const=5.0,
    coverage=0.1,
    decay=StepDecay(),
    clip_norm=5.0,
    goal=bleu_goal(24.0, 20.0),
)
#: The smoke size (NOT task 4b): a 2+2-layer, 64-wide model on the synthetic pair, learnt to BLEU 60 in a few
#: epochs of a 3000-pair corpus on a CPU. The rule (Adam, warm-up then inverse-sqrt, label smoothing, loss
#: scaling, accumulation, beam 4 with length penalty 0.6) is 4b's; sizes, rate and warm-up are scaled down.
SMOKE = TranslationRecipe(
    shape=TransformerShape(d_model=64, heads=4, ffn=128, encoder_layers=2, decoder_layers=2, max_positions=64),
    global_tokens=1024,
    max_tokens=512,
    peak_lr=3e-3,
    warmup=50,
    max_length=24,
    max_epochs=10,
    goal=bleu_goal(60.0),
)

#: The GNMT smoke size (NOT task 4a): 4a's rule on a 2 + 2-layer, 256-wide GNMT without dropout on the synthetic pair,
#: 64 sentences per step, peak 6e-3 after 20 steps, the first halving after 80 % of 12 epochs, decoding at most 16
#: tokens (the pair's sentences have at most 12), goal 6 BLEU (GNMT learns the pair's alignment far more slowly than
#: the Transformer: about 1 BLEU after the first epoch, about 7 after the fourth on 2 ranks; the goal was 8, met at
#: the fifth, until the mpi test made the run's cost count twice in CI: docs/tasks-translation.md).
SMOKE_GNMT = dataclasses.replace(
    RECIPE_4A,
    shape=GnmtShape(hidden=256, layers=2, dropout=0.0),
    sentences_per_step=64,
    max_sentences=32,
    peak_lr=6e-3,
    warmup=20,
    max_length=24,
    test_max_length=16,
    max_epochs=12,
    decay=StepDecay(start=0.8),
    goal=bleu_goal(6.0),
)


@dataclass(frozen=True)
class EpochScore:
    epoch: int
    score: float  #: the goal metric's value
    bleu: float | None  #: only when the goal is BLEU (decoding costs more than an epoch of the smoke task)
    test_loss: float  #: mean NLL per target token of the test split (perplexity: its exp)
    loss: float  #: mean label-smoothed training loss per target token
    wall_seconds: float


@dataclass
class TranslationResult:
    history: list[EpochScore] = field(default_factory=list)
    time_to_goal: float | None = None  #: the first evaluation that met the goal
    reached: bool = False  #: time-to-accuracy: met at some evaluation; accuracy-after-time: at the last one
    steps: int = 0
    skipped_steps: int = 0  #: optimizer steps the loss scaler dropped (non-finite gradient)
    update_freq: int = 1
    tokens: int = 0  #: target tokens trained on, all ranks
    compute_seconds: float = 0.0
    communication_seconds: float = 0.0
    signature: str = ""  #: sacrebleu's
    sent: StepBytes = field(default_factory=StepBytes)  #: a registry algorithm's declared and counted bytes
    hypotheses: list[str] = field(default_factory=list)  #: the last evaluation's, in test-set order

    def communication(self) -> CommunicationRecord | None:
        """The registry algorithm's declared bytes per step next to those counted in the steps (None: fused)."""
        return self.sent.record(self.steps)


def build_model(shape: TransformerShape | GnmtShape, vocab: Vocabulary) -> nn.Module:
    """The recipe's network over ``vocab``: a Transformer (4b) or GNMT (4a) by the shape's type."""
    if isinstance(shape, GnmtShape):
        return Gnmt(len(vocab), vocab.pad, shape)
    return Transformer(len(vocab), vocab.pad, shape)


def unwrapped(model: nn.Module) -> nn.Module:
    """The network inside DDP's wrapper (ddp), or ``model`` itself."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def seq2seq(model: nn.Module) -> Seq2Seq:
    """``model`` as the search sees it (both kinds of :func:`build_model` are)."""
    assert isinstance(model, Transformer | Gnmt)
    return model


def rank_batches(lengths: list[int], recipe: TranslationRecipe, world: int) -> tuple[list[list[int]], int]:
    """The epoch's micro-batches (sentence indices) and update_freq for ``world`` ranks: by tokens (4b), or by
    sentences when the recipe counts them (4a), each micro-batch at most b / (world * update_freq)."""
    if recipe.sentences_per_step is not None:
        freq = update_freq(recipe.sentences_per_step, recipe.max_sentences, world)
        return sentence_batches(lengths, max(1, recipe.sentences_per_step // (world * freq))), freq
    freq = update_freq(recipe.global_tokens, recipe.max_tokens, world)
    return token_batches(lengths, recipe.global_tokens // (world * freq)), freq


def step_plan(
    batches: list[list[int]], *, world: int, rank: int, freq: int, seed: int, epoch: int
) -> list[list[list[int]]]:
    """This rank's micro-batches per optimizer step: the batches shuffled alike on every rank (by seed and epoch),
    cut into steps of ``world * freq``, rank r taking the r-th ``freq`` of each; a short last step is dropped."""
    order = list(batches)
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    per_step = world * freq
    return [
        order[start + rank * freq : start + (rank + 1) * freq]
        for start in range(0, len(order) - per_step + 1, per_step)
    ]


def micro_batch(
    data: ParallelText, rows: list[int], vocab: Vocabulary, device: torch.device | None = None
) -> MicroBatch:
    target = pad_batch([data.target[i] for i in rows], vocab.pad).to(device)
    source = pad_batch([data.source[i] for i in rows], vocab.pad).to(device)
    return MicroBatch(source, shift_right(target, vocab.bos, vocab.pad), target)


def translate(
    model: nn.Module, data: ParallelText, rows: list[int], vocab: Vocabulary, recipe: TranslationRecipe
) -> list[list[int]]:
    """Beam-search hypotheses (token ids, no eos) for sentences ``rows`` of ``data``."""
    model.eval()
    device = next(model.parameters()).device
    out: list[list[int]] = []
    for start in range(0, len(rows), DECODE_BATCH):
        chunk = rows[start : start + DECODE_BATCH]
        source = pad_batch([data.source[i] for i in chunk], vocab.pad).to(device)
        out += beam_search(
            seq2seq(model),
            source,
            bos=vocab.bos,
            eos=vocab.eos,
            max_length=recipe.longest_test,
            beam=recipe.beam,
            length_penalty=recipe.length_penalty,
            length_const=recipe.length_const,
            coverage=recipe.coverage,
        )
    model.train()
    return out


@torch.no_grad()
def mean_test_nll(
    model: nn.Module, data: ParallelText, rows: list[int], vocab: Vocabulary, comm: Communicator
) -> float:
    """Mean NLL per target token (no smoothing) over every rank's ``rows`` of ``data``, teacher-forced."""
    model.eval()
    device = next(model.parameters()).device
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    lengths = [max(len(data.source[i]), len(data.target[i])) for i in rows]
    for batch in token_batches(lengths, 4096):
        mb = micro_batch(data, [rows[i] for i in batch], vocab, device)
        logits = model(mb.source, mb.previous).float()
        totals[0] += label_smoothed_loss(logits, mb.target, vocab.pad, 0.0).double()
        totals[1] += int(mb.target.ne(vocab.pad).sum())
    model.train()
    comm.all_reduce_sum_(totals)
    return float(totals[0] / totals[1].clamp(min=1))


def budget_spent(comm: Communicator, started: float, budget: float | None, device: torch.device) -> bool:
    """Rank 0's clock decides for every rank (collective when there is a budget)."""
    if budget is None:
        return False
    flag = torch.tensor([1.0 if time.perf_counter() - started >= budget else 0.0], device=device)
    comm.broadcast_(flag, src=0)
    return bool(flag.item() > 0)


def gather_hypotheses(
    comm: Communicator, mine: list[list[int]], total: int, width: int, device: torch.device | None = None
) -> list[list[int]]:
    """Every rank's hypotheses (rank r decoded sentences r, r + k, ...) back in test-set order, on every rank."""
    rows = -(-total // comm.size)
    block = torch.full((rows, width), -1, dtype=torch.long)
    for i, ids in enumerate(mine):
        block[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    gathered = comm.all_gather(block.to(device)).cpu()  # (ranks, rows, width)
    ordered: list[list[int]] = []
    for i in range(total):
        row = gathered[i % comm.size, i // comm.size]
        ordered.append([int(t) for t in row if t >= 0])
    return ordered


def one_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[MicroBatch],
    comm: Communicator,
    scaler: LossScaler,
    *,
    algorithm: DistributedAlgorithm | None,
    result: TranslationResult,
    options: dict[str, Any],
) -> StepOutcome:
    """The fused step, or the registry algorithm's (its bytes counted into ``result``)."""
    if algorithm is None:
        return accumulated_step(model, optimizer, batches, comm, scaler, **options)
    sent = counted_bytes(algorithm)
    outcome = algorithm_step(model, optimizer, batches, comm, scaler, algorithm=algorithm, **options)
    result.sent.sent += counted_bytes(algorithm) - sent
    return outcome


def evaluate(
    model: nn.Module,
    test: ParallelText,
    vocab: Vocabulary,
    recipe: TranslationRecipe,
    *,
    comm: Communicator,
    result: TranslationResult,
    algorithm: DistributedAlgorithm | None = None,
) -> tuple[float, float | None]:
    """The test split's mean NLL, and BLEU when the goal is BLEU (its hypotheses and signature into ``result``);
    under ``algorithm``, of the model it evaluates (gossip: the ranks' average, put back afterwards)."""
    device = next(model.parameters()).device
    mine_rows = list(range(comm.rank, len(test.source), comm.size))
    if algorithm is not None:
        algorithm.before_evaluation(model)
    nll = mean_test_nll(model, test, mine_rows, vocab, comm)
    mine = translate(model, test, mine_rows, vocab, recipe) if recipe.goal.metric is GoalMetric.BLEU else None
    if algorithm is not None:
        algorithm.after_evaluation(model)
    if mine is None:
        return nll, None
    ids = gather_hypotheses(comm, mine, len(test.source), recipe.longest_test + 1, device)
    result.hypotheses = [merge_bpe(vocab.decode(h)) for h in ids]
    scored = corpus_bleu(result.hypotheses, test.references)
    result.signature = scored.signature
    return nll, scored.score


def train_translation(
    root: Path,
    recipe: TranslationRecipe,
    comm: Communicator,
    *,
    seed: int = 0,
    autocast: torch.dtype | None = None,
    src: str = "en",
    tgt: str = "de",
    device: torch.device | None = None,
    metrics: RunnerMetrics | None = None,
    log: EventLog | None = None,
    algorithm: DistributedAlgorithm | None = None,
) -> TranslationResult:
    """Train on ``root``'s ``train`` split to the recipe's goal on the ``test`` split: time-to-accuracy stops at
    the first evaluation that meets it; accuracy-after-time trains until the budget is spent (checked every
    BUDGET_EVERY steps) and is judged by its last evaluation. Either way at most ``max_epochs``. Each step is the
    fused all-reduce (:func:`~.optim.accumulated_step`), or with ``algorithm`` (a registry algorithm over ``comm``)
    :func:`~.algorithm_step.algorithm_step`, which evaluates the ranks' consensus model as the Trainer does."""
    clock = time.perf_counter()
    goal = recipe.goal
    budget = goal.time_budget_seconds if goal.mode is GoalMode.ACCURACY_AFTER_TIME else None
    vocab = read_dictionary(root / "dict.txt")
    train = read_split(root, "train", vocab, src=src, tgt=tgt, max_tokens=recipe.max_length)
    test = read_split(root, "test", vocab, src=src, tgt=tgt, max_tokens=recipe.longest_test)
    torch.manual_seed(seed)  # the same initial model on every rank
    device = device or torch.device("cpu")
    model = build_model(recipe.shape, vocab).to(device)
    if algorithm is not None:
        model = algorithm.prepare(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=recipe.betas, eps=recipe.eps)
    scaler = LossScaler(recipe.initial_scale, recipe.scale_factor, recipe.scale_window, recipe.max_scale)
    lengths = [max(len(s), len(t)) for s, t in zip(train.source, train.target, strict=True)]
    batches, freq = rank_batches(lengths, recipe, comm.size)
    total_steps = len(batches) // (comm.size * freq) * recipe.max_epochs
    plan = algorithm.plan(model) if algorithm is not None else None
    result = TranslationResult(update_freq=freq, sent=StepBytes(plan, counted=algorithm is None or algorithm.counted))
    net = unwrapped(model)  # what evaluation runs: DDP's forward would broadcast buffers, a collective per batch
    torch.manual_seed(seed * 7919 + comm.rank)  # dropout differs by rank
    for epoch in range(recipe.max_epochs):
        loss_tokens, loss_sum, out_of_time = 0, 0.0, False
        for rows in step_plan(batches, world=comm.size, rank=comm.rank, freq=freq, seed=seed, epoch=epoch):
            lr = recipe.rate(result.steps, total_steps)
            options = {
                "lr": lr,
                "pad": vocab.pad,
                "smoothing": recipe.smoothing,
                "autocast": autocast,
                "per_sentence": recipe.sentences_per_step is not None,
                "clip_norm": recipe.clip_norm,
            }
            batches_now = [micro_batch(train, r, vocab, device) for r in rows]
            outcome = one_step(
                model, optimizer, batches_now, comm, scaler, algorithm=algorithm, result=result, options=options
            )
            result.steps += 1
            result.tokens += outcome.tokens
            result.compute_seconds += outcome.compute_seconds
            result.communication_seconds += outcome.communication_seconds
            loss_sum += outcome.loss * outcome.tokens
            loss_tokens += outcome.tokens
            if metrics is not None:  # compute is not split into forward/backward/optimizer here: only comm is
                metrics.steps.inc()
                metrics.samples.inc(outcome.tokens / comm.size)
                metrics.lr.set(lr)
                metrics.phase_seconds.labels("communication").inc(outcome.communication_seconds)
                metrics.step_duration.observe(outcome.compute_seconds + outcome.communication_seconds)
            if result.steps % BUDGET_EVERY == 0 and budget_spent(comm, clock, budget, device):
                out_of_time = True
                break
        result.skipped_steps = scaler.skipped
        nll, bleu = evaluate(net, test, vocab, recipe, comm=comm, result=result, algorithm=algorithm)
        score = epoch_score(goal.metric, 0.0, nll, bleu)
        elapsed = time.perf_counter() - clock
        record = EpochScore(epoch + 1, score, bleu, nll, loss_sum / max(loss_tokens, 1), elapsed)
        result.history.append(record)
        met = goal.met(score)
        if metrics is not None:
            metrics.epoch.set(epoch + 1)
            metrics.loss.set(record.loss)
            metrics.score.set(score)
            metrics.goal.set(1 if met else 0)
            busy = result.compute_seconds + result.communication_seconds
            metrics.throughput.set(result.tokens / busy if busy > 0 else 0.0)
        if log is not None:
            log.event(
                "eval_accuracy",
                epoch=epoch + 1,
                metric=goal.metric.value,
                score=score,
                bleu=bleu,
                test_nll=nll,
                target=goal.target,
                elapsed_s=round(elapsed, 3),
            )
            log.event(
                "epoch_stop",
                epoch=epoch + 1,
                loss=record.loss,
                step=result.steps,
                skipped_steps=scaler.skipped,
                samples_per_second=result.tokens / max(result.compute_seconds + result.communication_seconds, 1e-9),
                elapsed_s=round(elapsed, 3),
            )
        if met and result.time_to_goal is None:
            result.time_to_goal = elapsed
        if budget is None and met:
            result.reached = True
            break
        if out_of_time or (budget is not None and budget_spent(comm, clock, budget, device)):
            break
    if budget is not None:
        result.reached = bool(result.history) and goal.met(result.history[-1].score)
    return result
