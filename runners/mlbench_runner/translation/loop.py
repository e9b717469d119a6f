"""One rank's translation training to a BLEU goal: the recipe's loop, flat.

Per epoch: the training sentences grouped into token-bounded micro-batches (fairseq's ``--max-tokens``), shuffled
alike on every rank, dealt out ``update_freq`` per rank per optimizer step; each step is
:func:`~.optim.accumulated_step` (one all-reduce). After each epoch every rank decodes its share of the test
set with beam search, the hypotheses are gathered, and BLEU (sacrebleu, detokenized) decides the stop on every
rank alike.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mlbench_runner.comm import Communicator
from mlbench_runner.translation.bleu import corpus_bleu
from mlbench_runner.translation.corpus import (
    ParallelText,
    Vocabulary,
    pad_batch,
    read_dictionary,
    read_split,
    token_batches,
)
from mlbench_runner.translation.decoding import beam_search
from mlbench_runner.translation.optim import LossScaler, MicroBatch, accumulated_step, inverse_sqrt_lr, update_freq
from mlbench_runner.translation.transformer import BASE, Transformer, TransformerShape, shift_right

#: Sentences per decoding batch at evaluation.
DECODE_BATCH = 64


@dataclass(frozen=True)
class TranslationRecipe:
    """Task 4b's hyperparameters (the public page's, and mlbench-benchmarks' reference where the page is silent)."""

    shape: TransformerShape = BASE
    global_tokens: int = 2**17  #: b, target tokens per optimizer step over all ranks
    max_tokens: int = 2**13  #: bs_max, tokens per micro-batch one device fits
    peak_lr: float = 1.976e-3
    warmup: int = 1000  #: optimizer steps of linear warm-up from 0
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    smoothing: float = 0.1
    initial_scale: float = 2.0**7
    scale_factor: float = 2.0
    scale_window: int = 2000
    max_length: int = 80  #: tokens per sentence (eos included), in training and test
    max_epochs: int = 10
    beam: int = 4
    length_penalty: float = 0.6
    target_bleu: float = 25.0


RECIPE_4B = TranslationRecipe()
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
    target_bleu=60.0,
)


@dataclass(frozen=True)
class EpochBleu:
    epoch: int
    bleu: float
    loss: float  #: mean label-smoothed training loss per target token
    wall_seconds: float


@dataclass
class TranslationResult:
    history: list[EpochBleu] = field(default_factory=list)
    time_to_goal: float | None = None
    steps: int = 0
    skipped_steps: int = 0  #: optimizer steps the loss scaler dropped (non-finite gradient)
    update_freq: int = 1
    tokens: int = 0  #: target tokens trained on, all ranks
    compute_seconds: float = 0.0
    communication_seconds: float = 0.0
    signature: str = ""  #: sacrebleu's
    hypotheses: list[str] = field(default_factory=list)  #: the last evaluation's, in test-set order

    @property
    def reached(self) -> bool:
        return self.time_to_goal is not None


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


def micro_batch(data: ParallelText, rows: list[int], vocab: Vocabulary) -> MicroBatch:
    target = pad_batch([data.target[i] for i in rows], vocab.pad)
    return MicroBatch(
        pad_batch([data.source[i] for i in rows], vocab.pad), shift_right(target, vocab.bos, vocab.pad), target
    )


def translate(
    model: Transformer, data: ParallelText, rows: list[int], vocab: Vocabulary, recipe: TranslationRecipe
) -> list[list[int]]:
    """Beam-search hypotheses (token ids, no eos) for sentences ``rows`` of ``data``."""
    model.eval()
    out: list[list[int]] = []
    for start in range(0, len(rows), DECODE_BATCH):
        chunk = rows[start : start + DECODE_BATCH]
        source = pad_batch([data.source[i] for i in chunk], vocab.pad)
        out += beam_search(
            model,
            source,
            bos=vocab.bos,
            eos=vocab.eos,
            max_length=recipe.max_length,
            beam=recipe.beam,
            length_penalty=recipe.length_penalty,
        )
    model.train()
    return out


def gather_hypotheses(comm: Communicator, mine: list[list[int]], total: int, width: int) -> list[list[int]]:
    """Every rank's hypotheses (rank r decoded sentences r, r + k, ...) back in test-set order, on every rank."""
    rows = -(-total // comm.size)
    block = torch.full((rows, width), -1, dtype=torch.long)
    for i, ids in enumerate(mine):
        block[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    gathered = comm.all_gather(block)  # (ranks, rows, width)
    ordered: list[list[int]] = []
    for i in range(total):
        row = gathered[i % comm.size, i // comm.size]
        ordered.append([int(t) for t in row if t >= 0])
    return ordered


def train_translation(
    root: Path,
    recipe: TranslationRecipe,
    comm: Communicator,
    *,
    seed: int = 0,
    autocast: torch.dtype | None = None,
    src: str = "en",
    tgt: str = "de",
) -> TranslationResult:
    """Train on ``root``'s ``train`` split until the ``test`` split's BLEU reaches the target or the epochs run out."""
    clock = time.perf_counter()
    vocab = read_dictionary(root / "dict.txt")
    train = read_split(root, "train", vocab, src=src, tgt=tgt, max_tokens=recipe.max_length)
    test = read_split(root, "test", vocab, src=src, tgt=tgt, max_tokens=recipe.max_length)
    torch.manual_seed(seed)  # the same initial model on every rank
    model = Transformer(len(vocab), vocab.pad, recipe.shape)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=recipe.betas, eps=recipe.eps)
    scaler = LossScaler(recipe.initial_scale, recipe.scale_factor, recipe.scale_window)
    freq = update_freq(recipe.global_tokens, recipe.max_tokens, comm.size)
    max_tokens = recipe.global_tokens // (comm.size * freq)
    lengths = [max(len(s), len(t)) for s, t in zip(train.source, train.target, strict=True)]
    batches = token_batches(lengths, max_tokens)
    result = TranslationResult(update_freq=freq)
    torch.manual_seed(seed * 7919 + comm.rank)  # dropout differs by rank
    for epoch in range(recipe.max_epochs):
        loss_tokens, loss_sum = 0, 0.0
        for rows in step_plan(batches, world=comm.size, rank=comm.rank, freq=freq, seed=seed, epoch=epoch):
            lr = inverse_sqrt_lr(result.steps + 1, recipe.peak_lr, recipe.warmup)
            outcome = accumulated_step(
                model,
                optimizer,
                [micro_batch(train, r, vocab) for r in rows],
                comm,
                scaler,
                lr=lr,
                pad=vocab.pad,
                smoothing=recipe.smoothing,
                autocast=autocast,
            )
            result.steps += 1
            result.tokens += outcome.tokens
            result.compute_seconds += outcome.compute_seconds
            result.communication_seconds += outcome.communication_seconds
            loss_sum += outcome.loss * outcome.tokens
            loss_tokens += outcome.tokens
        result.skipped_steps = scaler.skipped
        mine = translate(model, test, list(range(comm.rank, len(test.source), comm.size)), vocab, recipe)
        ids = gather_hypotheses(comm, mine, len(test.source), recipe.max_length + 1)
        result.hypotheses = [vocab.decode(h) for h in ids]
        score = corpus_bleu(result.hypotheses, test.references)
        result.signature = score.signature
        elapsed = time.perf_counter() - clock
        result.history.append(EpochBleu(epoch + 1, score.score, loss_sum / max(loss_tokens, 1), elapsed))
        if score.score >= recipe.target_bleu:
            result.time_to_goal = elapsed
            break
    return result
