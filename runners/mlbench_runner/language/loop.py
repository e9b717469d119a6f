"""One rank's AWD-LSTM training to a perplexity goal: task 3a's recipe, flat.

Per epoch: the BPTT window lengths drawn from (seed, epoch), alike on every rank; per window the loss (cross-entropy
plus AR and TAR), the gradient synchronized by the run's registry algorithm (allreduce-sgd: one all-reduce and the
average; powersgd, sign-sgd, sparsified-sgd: their compressed average; decentralized-sgd: none, gossip after the
step), clipped at the recipe's norm, and an SGD step at eta * seq_len / bptt (warmed up to eta * sqrt(k)); the
shared step is :func:`mlbench_runner.algorithms.loop_step.registry_step`. After each epoch the validation split is
scored (every rank its share of the evaluation streams, the NLL sums all-reduced; decentralized-sgd: of the ranks'
average model); when the validation loss stops improving for ``nonmono`` epochs, the parameters are averaged from
then on (NT-ASGD: each rank averages its own iterates) and evaluation uses the average (docs/algorithms.md).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mlbench_api.goal import Goal, GoalMetric, GoalMode
from mlbench_api.results import CommunicationRecord
from mlbench_runner.algorithms import DistributedAlgorithm, make_algorithm
from mlbench_runner.algorithms.loop_step import StepBytes, counted_bytes, registry_step
from mlbench_runner.comm import Communicator, CountingCommunicator
from mlbench_runner.events import EventLog
from mlbench_runner.goals import epoch_score, perplexity
from mlbench_runner.language.corpus import LanguageCorpus, batchify
from mlbench_runner.language.model import AwdLstm, AwdLstmShape, detach
from mlbench_runner.language.rules import (
    ParameterAverage,
    activation_regularization,
    batch_rate,
    sequence_lengths,
    switch_to_averaging,
    temporal_activation_regularization,
    warmed_rate,
)
from mlbench_runner.metrics import RunnerMetrics

#: Optimizer steps between two checks of an accuracy-after-time budget (rank 0's clock, broadcast).
BUDGET_EVERY = 25


@dataclass(frozen=True)
class LanguageRecipe:
    """Task 3a's hyperparameters: the public page's, the reference code's (salesforce/awd-lstm-lm) where it is
    silent (docs/tasks-language.md)."""

    shape: AwdLstmShape = field(default_factory=AwdLstmShape)
    batch: int = 80  #: streams per rank
    bptt: int = 70
    random_length: bool = True
    short_probability: float = 0.05
    length_std: float = 5.0
    min_length: int = 5
    rate: float = 30.0  #: eta for a window of bptt
    warmup_epochs_per_worker: float = 3.0
    weight_decay: float = 1.2e-6
    clip: float = 0.25
    alpha: float = 2.0  #: AR
    beta: float = 1.0  #: TAR
    nonmono: int = 5
    eval_batch: int = 10  #: evaluation streams (all ranks together)
    max_epochs: int = 750
    evaluate_on: str = "valid"
    goal: Goal = field(default_factory=lambda: Goal(metric=GoalMetric.PERPLEXITY, target=68.6, light_target=70.0))


RECIPE_3A = LanguageRecipe()


@dataclass(frozen=True)
class EpochScore:
    epoch: int
    score: float  #: the goal metric's value on the evaluated split
    nll: float  #: mean NLL per token of the evaluated split
    loss: float  #: mean training cross-entropy per token (without AR/TAR)
    averaging: bool  #: evaluated with the averaged parameters
    wall_seconds: float


@dataclass
class LanguageResult:
    history: list[EpochScore] = field(default_factory=list)
    time_to_goal: float | None = None
    reached: bool = False
    steps: int = 0
    tokens: int = 0  #: target tokens trained on, all ranks
    averaging_from_epoch: int | None = None  #: the epoch after which NT-ASGD began averaging
    test_perplexity: float | None = None  #: of the final model (averaged if averaging), on the test split
    compute_seconds: float = 0.0
    communication_seconds: float = 0.0
    sent: StepBytes = field(default_factory=StepBytes)  #: the algorithm's declared and counted bytes per step

    def communication(self) -> CommunicationRecord | None:
        """The algorithm's declared bytes per step next to those counted in the steps."""
        return self.sent.record(self.steps)


@torch.no_grad()
def evaluate(model: AwdLstm, ids: torch.Tensor, recipe: LanguageRecipe, comm: Communicator) -> float:
    """Mean NLL per token of ``ids`` in ``eval_batch`` streams, every window ``bptt`` long with the state carried
    over (each token scored once); rank r scores streams r, r + k, ... and the sums are all-reduced."""
    model.eval()
    device = model.encoder.weight.device
    streams = batchify(ids, recipe.eval_batch).to(device)
    mine = streams[:, comm.rank :: comm.size]
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    if mine.size(1):
        hidden = model.init_hidden(mine.size(1))
        start = 0
        for length in sequence_lengths(mine.size(0), recipe.bptt, None):
            words, target = mine[start : start + length], mine[start + 1 : start + 1 + length]
            out = model(words, hidden)
            hidden = out.hidden
            totals[0] += F.cross_entropy(out.logits, target.reshape(-1), reduction="sum").double()
            totals[1] += target.numel()
            start += length
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


@dataclass
class Trainee:
    model: AwdLstm
    optimizer: torch.optim.SGD
    average: ParameterAverage
    params: list[torch.nn.Parameter]
    algorithm: DistributedAlgorithm  #: prepared on ``model``; its communicator counts its bytes


def trainee(model: AwdLstm, recipe: LanguageRecipe, algorithm: DistributedAlgorithm) -> Trainee:
    """``model`` prepared by ``algorithm`` (rank 0's parameters everywhere), its SGD and its (idle) average."""
    if algorithm.prepare(model) is not model:  # ddp's wrapper: not one of LANGUAGE_MODEL_ALGORITHMS
        raise ValueError(f"algorithm: {algorithm.name} wraps the model; the awd-lstm loop trains it as it is")
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=recipe.rate, weight_decay=recipe.weight_decay)
    return Trainee(model, optimizer, ParameterAverage(), params, algorithm)


def default_algorithm(comm: Communicator) -> DistributedAlgorithm:
    """The reference, allreduce-sgd, over a counting view of ``comm``."""
    return make_algorithm("allreduce-sgd", CountingCommunicator(comm))


def train_window(
    t: Trainee,
    words: torch.Tensor,
    target: torch.Tensor,
    hidden: list,
    *,
    recipe: LanguageRecipe,
    lr: float,
    sent: StepBytes | None = None,
) -> tuple[list, float, float, float]:
    """One BPTT window: the step through the algorithm (its counted bytes added to ``sent``), then the average's
    update; (hidden, cross-entropy, compute s, communication s). Every rank's loss is the mean over its own
    window of equal size, so an averaging algorithm's exact average is the mean over all ranks' tokens."""
    started = time.perf_counter()
    t.algorithm.zero_grad(t.model)  # in place: the algorithm's gradient buffers stay
    out = t.model(words, detach(hidden))
    loss = F.cross_entropy(out.logits, target.reshape(-1))
    regularized = loss + activation_regularization(out.dropped, recipe.alpha)
    regularized = regularized + temporal_activation_regularization(out.raw, recipe.beta)
    regularized.backward()
    before = counted_bytes(t.algorithm)
    communication = registry_step(t.model, t.optimizer, t.algorithm, lr=lr, clip_norm=recipe.clip, params=t.params)
    if sent is not None:
        sent.sent += counted_bytes(t.algorithm) - before
    t.average.update(t.params)  # after the gossip: the iterate this rank goes on from
    compute = time.perf_counter() - started - communication
    return out.hidden, float(loss.detach()), compute, communication


def train_language(
    corpus: LanguageCorpus,
    recipe: LanguageRecipe,
    comm: Communicator,
    *,
    seed: int = 0,
    device: torch.device | None = None,
    metrics: RunnerMetrics | None = None,
    log: EventLog | None = None,
    algorithm: DistributedAlgorithm | None = None,
) -> LanguageResult:
    """Train to the recipe's goal on its evaluated split (time-to-accuracy: the first epoch that meets it;
    accuracy-after-time: the last evaluation once the budget is spent), at most ``max_epochs``; ``algorithm``: a
    registry algorithm over a counting view of ``comm`` (default allreduce-sgd), not yet prepared."""
    clock = time.perf_counter()
    goal = recipe.goal
    budget = goal.time_budget_seconds if goal.mode is GoalMode.ACCURACY_AFTER_TIME else None
    device = device or torch.device("cpu")
    torch.manual_seed(seed)  # the same initial model on every rank
    algorithm = algorithm or default_algorithm(comm)
    t = trainee(AwdLstm(len(corpus.vocab), recipe.shape).to(device), recipe, algorithm)
    model = t.model
    data = batchify(corpus.train, recipe.batch, comm.rank, comm.size).to(device)
    held_out = corpus.valid if recipe.evaluate_on == "valid" else corpus.test
    result = LanguageResult(sent=StepBytes(algorithm.plan(model)))
    losses: list[float] = []
    torch.manual_seed(seed * 7919 + comm.rank)  # dropout masks differ by rank
    for epoch in range(recipe.max_epochs):
        lengths = epoch_lengths(recipe, data.size(0), seed, epoch)
        hidden, start, loss_sum, loss_tokens, out_of_time = model.init_hidden(recipe.batch), 0, 0.0, 0, False
        for i, length in enumerate(lengths):
            base = warmed_rate(recipe.rate, comm.size, epoch + i / len(lengths), recipe.warmup_epochs_per_worker)
            lr = batch_rate(base, length, recipe.bptt)
            words, target = data[start : start + length], data[start + 1 : start + 1 + length]
            hidden, loss, compute, communication = train_window(
                t, words, target, hidden, recipe=recipe, lr=lr, sent=result.sent
            )
            start += length
            count_window(result, metrics, target.numel(), comm.size, lr=lr, seconds=(compute, communication))
            loss_sum += loss * target.numel()
            loss_tokens += target.numel()
            if result.steps % BUDGET_EVERY == 0 and budget_spent(comm, clock, budget, device):
                out_of_time = True
                break
        averaged = t.average.active
        nll = evaluate_average(t, held_out, recipe, comm)  # the average once averaging began
        if not t.average.active and switch_to_averaging(losses, nll, recipe.nonmono):
            start_averaging(t, result, epoch, log, best_before=min(losses[: -recipe.nonmono]), nll=nll)
        losses.append(nll)
        score = epoch_score(goal.metric, 0.0, nll)
        elapsed = time.perf_counter() - clock
        record = EpochScore(epoch + 1, score, nll, loss_sum / max(loss_tokens, 1), averaged, elapsed)
        result.history.append(record)
        met = goal.met(score)
        report(metrics, log, record, result, goal=goal, met=met)
        if met and result.time_to_goal is None:
            result.time_to_goal = elapsed
        if budget is None and met:
            result.reached = True
            break
        if out_of_time or (budget is not None and budget_spent(comm, clock, budget, device)):
            break
    if budget is not None:
        result.reached = bool(result.history) and goal.met(result.history[-1].score)
    result.test_perplexity = perplexity(evaluate_average(t, corpus.test, recipe, comm))
    return result


def epoch_lengths(recipe: LanguageRecipe, tokens: int, seed: int, epoch: int) -> list[int]:
    """The epoch's BPTT window lengths (random ones drawn from the seed and the epoch: the same on every rank)."""
    rng = random.Random(seed * 1_000_003 + epoch) if recipe.random_length else None
    return sequence_lengths(
        tokens,
        recipe.bptt,
        rng,
        short_probability=recipe.short_probability,
        std=recipe.length_std,
        min_length=recipe.min_length,
    )


def count_window(
    result: LanguageResult,
    metrics: RunnerMetrics | None,
    tokens: int,
    ranks: int,
    *,
    lr: float,
    seconds: tuple[float, float],
) -> None:
    """One window of ``tokens`` target tokens per rank into the result and the rank's metrics; ``seconds``:
    its compute and communication."""
    compute, communication = seconds
    result.steps += 1
    result.tokens += tokens * ranks
    result.compute_seconds += compute
    result.communication_seconds += communication
    if metrics is not None:
        metrics.steps.inc()
        metrics.samples.inc(tokens)
        metrics.lr.set(lr)
        metrics.phase_seconds.labels("communication").inc(communication)
        metrics.step_duration.observe(compute + communication)


def evaluate_average(t: Trainee, split: torch.Tensor, recipe: LanguageRecipe, comm: Communicator) -> float:
    """The mean negative log-likelihood on ``split`` of the averaged parameters (the model's own until averaging
    starts) under the algorithm's evaluation (decentralized-sgd: their mean over ranks), the model's put back
    after."""
    t.average.swap(t.params)
    try:
        t.algorithm.before_evaluation(t.model)
        try:
            return evaluate(t.model, split, recipe, comm)
        finally:
            t.algorithm.after_evaluation(t.model)
    finally:
        t.average.swap(t.params)


def start_averaging(
    t: Trainee, result: LanguageResult, epoch: int, log: EventLog | None, *, best_before: float, nll: float
) -> None:
    """NT-ASGD's switch after ``epoch``: the average starts from the parameters now."""
    t.average.start(t.params)
    result.averaging_from_epoch = epoch + 1
    if log is not None:
        log.event("asgd_switch", epoch=epoch + 1, valid_nll=nll, best_before=best_before)


def report(
    metrics: RunnerMetrics | None,
    log: EventLog | None,
    record: EpochScore,
    result: LanguageResult,
    *,
    goal: Goal,
    met: bool,
) -> None:
    """The epoch's Prometheus series and events (as the Trainer's)."""
    busy = result.compute_seconds + result.communication_seconds
    if metrics is not None:
        metrics.epoch.set(record.epoch)
        metrics.loss.set(record.loss)
        metrics.score.set(record.score)
        metrics.goal.set(1 if met else 0)
        metrics.throughput.set(result.tokens / busy if busy > 0 else 0.0)
    if log is not None:
        log.event(
            "eval_accuracy",
            epoch=record.epoch,
            metric=goal.metric.value,
            score=record.score,
            valid_nll=record.nll,
            averaged=record.averaging,
            target=goal.target,
            elapsed_s=round(record.wall_seconds, 3),
        )
        log.event(
            "epoch_stop",
            epoch=record.epoch,
            loss=record.loss,
            step=result.steps,
            samples_per_second=result.tokens / max(busy, 1e-9),
            elapsed_s=round(record.wall_seconds, 3),
        )


#: The smoke size (NOT task 3a): a 3-layer, 64-wide AWD-LSTM on the synthetic corpus (NOT WikiText-2), its
#: perplexity goal met in a few epochs on a CPU. The rules (random BPTT lengths, rate per window, warm-up over
#: workers, clipping, AR/TAR, NT-ASGD, weight drop, locked and embedding dropout, tied weights) are 3a's; sizes,
#: windows, rate (30 does not train a model this small) and the non-monotone interval are scaled down.
SMOKE = LanguageRecipe(
    shape=AwdLstmShape(
        embedding=32,
        hidden=64,
        layers=3,
        dropout=0.1,
        dropout_hidden=0.1,
        dropout_input=0.1,
        dropout_embedding=0.05,
        weight_drop=0.2,
    ),
    batch=10,
    bptt=20,
    min_length=5,
    length_std=2.0,
    rate=8.0,
    nonmono=2,
    eval_batch=10,
    max_epochs=15,
    goal=Goal(metric=GoalMetric.PERPLEXITY, target=7.0, light_target=10.0),
)
