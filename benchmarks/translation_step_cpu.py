"""The runner's Transformer optimizer step against a plain PyTorch loop: same model, same batches, one run.

Both sides train a fresh copy of the same Transformer (the smoke shape, or ``--shape base``: task 4b's) on the
same token-bounded micro-batches of the synthetic language pair (NOT WMT), ``--update-freq`` micro-batches per
optimizer step, Adam(0.9, 0.98, 1e-9):

* runner: :func:`mlbench_runner.translation.optim.accumulated_step` (loss scaling, the flat gradient's one
  all-reduce, here through the single-process communicator, deflation by the token count, overflow check);
* plain: ``loss / tokens`` backward per micro-batch, ``optimizer.step()``, nothing else.

The two alternate in rounds of ``--steps`` steps (so a noisy neighbour slows both alike), and the table prints
target tokens per second and milliseconds per optimizer step for each, and the runner's overhead.

    .venv/bin/python benchmarks/translation_step_cpu.py --steps 20 --rounds 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mlbench_runner.comm import LocalCommunicator
from mlbench_runner.translation.corpus import read_dictionary, read_split, token_batches, write_synthetic
from mlbench_runner.translation.loop import SMOKE, micro_batch
from mlbench_runner.translation.optim import LossScaler, MicroBatch, accumulated_step, label_smoothed_loss
from mlbench_runner.translation.transformer import BASE, Transformer, TransformerShape

SMOOTHING = 0.1


def runner_step(model: Transformer, autocast: torch.dtype | None) -> Callable[[list[MicroBatch]], int]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    comm, scaler = LocalCommunicator("gloo"), LossScaler()

    def step(batches: list[MicroBatch]) -> int:
        out = accumulated_step(
            model, optimizer, batches, comm, scaler, lr=1e-4, pad=model.pad, smoothing=SMOOTHING, autocast=autocast
        )
        return out.tokens

    return step


def plain_step(model: Transformer, autocast: torch.dtype | None) -> Callable[[list[MicroBatch]], int]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(batches: list[MicroBatch]) -> int:
        tokens = sum(int(b.target.ne(model.pad).sum()) for b in batches)
        optimizer.zero_grad(set_to_none=True)
        for b in batches:
            with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
                logits = model(b.source, b.previous)
            (label_smoothed_loss(logits, b.target, model.pad, SMOOTHING) / tokens).backward()
        optimizer.step()
        return tokens

    return step


def timed(step: Callable[[list[MicroBatch]], int], steps: list[list[MicroBatch]]) -> tuple[float, int]:
    started = time.perf_counter()
    tokens = sum(step(batches) for batches in steps)
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("smoke", "base"), default="smoke")
    parser.add_argument("--max-tokens", type=int, default=SMOKE.max_tokens, help="tokens per micro-batch (bs_max)")
    parser.add_argument("--update-freq", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    autocast = torch.bfloat16 if args.precision == "bf16" else None
    shape = BASE if args.shape == "base" else SMOKE.shape
    assert isinstance(shape, TransformerShape)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic(Path(tmp), {"train": 4000}, seed=0)
        vocab = read_dictionary(root / "dict.txt")
        train = read_split(root, "train", vocab)
    lengths = [max(len(s), len(t)) for s, t in zip(train.source, train.target, strict=True)]
    batches = [micro_batch(train, rows, vocab) for rows in token_batches(lengths, args.max_tokens)]
    per_step = args.update_freq
    steps = [batches[(i * per_step) % len(batches) :][:per_step] for i in range(args.steps)]
    steps = [s for s in steps if len(s) == per_step]
    sides: dict[str, Callable[[list[MicroBatch]], int]] = {}
    for name, make in (("runner", runner_step), ("plain", plain_step)):
        torch.manual_seed(0)
        sides[name] = make(Transformer(len(vocab), vocab.pad, shape).train(), autocast)
    for step in sides.values():  # warm-up: allocator, kernels
        timed(step, steps[:2])
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, int] = dict.fromkeys(sides, 0)
    for _ in range(args.rounds):
        for name, step in sides.items():
            elapsed, n = timed(step, steps)
            seconds[name].append(elapsed)
            tokens[name] += n
    print(
        f"Transformer {args.shape} (d={shape.d_model}, {shape.encoder_layers}+{shape.decoder_layers} layers), "
        f"{args.precision}, {len(steps)} steps x {per_step} micro-batches of <= {args.max_tokens} tokens, "
        f"{args.rounds} rounds, {torch.get_num_threads()} threads"
    )
    print(f"{'loop':<8} {'tokens/s':>10} {'ms/step':>9} {'ms/step (best round)':>21}")
    rates = {}
    for name in sides:
        total = sum(seconds[name])
        rates[name] = tokens[name] / total
        per = 1e3 * total / (len(steps) * args.rounds)
        best = 1e3 * min(seconds[name]) / len(steps)
        print(f"{name:<8} {rates[name]:>10,.0f} {per:>9.1f} {best:>21.1f}")
    print(f"runner / plain time per step: {rates['plain'] / rates['runner']:.3f}")


if __name__ == "__main__":
    main()
