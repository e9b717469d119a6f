"""The runner's Transformer optimizer step against a plain PyTorch loop: same model, same batches, one run.

Both sides train a fresh copy of the same Transformer (the smoke shape, or ``--shape base``: task 4b's) on the
same token-bounded micro-batches of the synthetic language pair (NOT WMT), ``--update-freq`` micro-batches per
optimizer step, Adam(0.9, 0.98, 1e-9):

* runner: :func:`mlbench_runner.translation.optim.accumulated_step` (loss scaling, the flat gradient's one
  all-reduce, here through the single-process communicator, deflation by the token count, overflow check);
* plain: ``loss / tokens`` backward per micro-batch, ``optimizer.step()``, nothing else.

The two alternate in rounds of ``--steps`` steps (so a noisy neighbour slows both alike), and the table prints
target tokens per second and milliseconds per optimizer step for each, and the runner's overhead. ``--out``
writes the raw JSON: the command, the configuration, the machine, and per round each side's seconds, tokens and
the 1-minute load average before and after it, with the round's ratio runner / plain (time per step). On a
shared, loaded machine compare the paired ratios, not the seconds.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/translation_step_cpu.py --steps 20 --rounds 3 --out x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def one_round(sides: dict[str, Callable[[list[MicroBatch]], int]], steps: list[list[MicroBatch]]) -> dict[str, Any]:
    """Each side's ``steps`` in turn: its seconds, target tokens and the load average around it; the paired ratio."""
    record: dict[str, Any] = {}
    for name, step in sides.items():
        load_before = os.getloadavg()[0]
        elapsed, tokens = timed(step, steps)
        record[name] = {"seconds": elapsed, "tokens": tokens, "load_1min": [load_before, os.getloadavg()[0]]}
    record["ratio_runner_over_plain"] = record["runner"]["seconds"] / record["plain"]["seconds"]
    return record


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("smoke", "base"), default="smoke")
    parser.add_argument("--max-tokens", type=int, default=SMOKE.max_tokens, help="tokens per micro-batch (bs_max)")
    parser.add_argument("--update-freq", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", type=Path, help="write the raw rounds (JSON) here")
    return parser.parse_args()


def main() -> None:
    args = parse()
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
    rounds = []
    for r in range(args.rounds):
        rounds.append(one_round(sides, steps))
        print(f"round {r}: runner / plain {rounds[-1]['ratio_runner_over_plain']:.3f}", flush=True)
    print(
        f"Transformer {args.shape} (d={shape.d_model}, {shape.encoder_layers}+{shape.decoder_layers} layers), "
        f"{args.precision}, {len(steps)} steps x {per_step} micro-batches of <= {args.max_tokens} tokens, "
        f"{args.rounds} rounds, {torch.get_num_threads()} threads"
    )
    print(f"{'loop':<8} {'tokens/s':>10} {'ms/step':>9} {'ms/step (best round)':>21}")
    rates = {}
    for name in sides:
        seconds = [r[name]["seconds"] for r in rounds]
        rates[name] = sum(r[name]["tokens"] for r in rounds) / sum(seconds)
        per = 1e3 * sum(seconds) / (len(steps) * args.rounds)
        best = 1e3 * min(seconds) / len(steps)
        print(f"{name:<8} {rates[name]:>10,.0f} {per:>9.1f} {best:>21.1f}")
    ratios = [r["ratio_runner_over_plain"] for r in rounds]
    overall = rates["plain"] / rates["runner"]
    print(f"runner / plain time per step: {overall:.3f} (rounds {min(ratios):.3f} to {max(ratios):.3f})")
    if args.out:
        write_out(args, shape, len(vocab), len(steps), rounds)


def write_out(args: argparse.Namespace, shape: TransformerShape, vocab: int, steps: int, rounds: list[dict]) -> None:
    """The raw rounds as JSON at ``args.out``, with the command, the configuration and the machine."""
    ratios = [r["ratio_runner_over_plain"] for r in rounds]
    config = {
        "shape": args.shape, "d_model": shape.d_model, "encoder_layers": shape.encoder_layers,
        "decoder_layers": shape.decoder_layers, "vocab": vocab, "precision": args.precision,
        "max_tokens": args.max_tokens, "update_freq": args.update_freq, "steps_per_round": steps,
        "rounds": args.rounds, "torch_threads": torch.get_num_threads(),
    }  # fmt: skip
    result = {
        "command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} {os.path.relpath(sys.executable)} "
        + " ".join(sys.argv),
        "note": "a 2-core machine shared with other engineers' test runs (loaded): the 1-minute load average "
        "before and after each side's timing is in its round; compare the paired ratios, not the seconds",
        "config": config,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "rounds": rounds,
        "median_ratio_runner_over_plain": statistics.median(ratios),
        "ratio_range_runner_over_plain": [min(ratios), max(ratios)],
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
