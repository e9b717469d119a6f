"""The Transformer's beam search, whole-prefix against incremental (step) decoding, side by side in one run.

Decode only: a Transformer with random weights (seeded; the smoke shape, or ``--shape base``: task 4b's) decodes
the synthetic pair's test sources (NOT WMT) in the runner's batches of ``DECODE_BATCH`` with the recipe's beam and
length penalty (``--max-length`` tokens at most; a random model rarely ends early, so hypotheses run to about
that length, longer than a trained smoke model's), once re-running the decoder over the whole prefix at every step
(``incremental=False``) and once from the cached keys and values (``incremental=True``). Each round times both on
the same sentences, in alternating order (a noisy neighbour slows both alike), checks that they found the same
hypotheses, and records the load average around each timing. The table prints the per-round ratio whole /
incremental and its median: ratios only, never seconds as a claim (the JSON keeps the raw seconds).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/transformer_decode_cpu.py --rounds 5 --json benchmarks/results/x.json
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
from pathlib import Path
from typing import Any

import torch

from mlbench_runner.translation.corpus import pad_batch, read_dictionary, read_split, write_synthetic
from mlbench_runner.translation.decoding import beam_search
from mlbench_runner.translation.loop import DECODE_BATCH, RECIPE_4B, SMOKE
from mlbench_runner.translation.transformer import Transformer, TransformerShape

MODES = ("whole", "incremental")


def decode_all(model: Transformer, batches: list[torch.Tensor], search: dict[str, Any], incremental: bool) -> list:
    out: list[list[int]] = []
    for source in batches:
        out += beam_search(model, source, incremental=incremental, **search)
    return out


def one_round(model: Transformer, batches: list[torch.Tensor], search: dict[str, Any], first: str) -> dict:
    """Both modes on the same batches, ``first`` first; seconds, load averages and the hypotheses' agreement."""
    record: dict = {"first": first}
    found = {}
    for mode in (first, *(m for m in MODES if m != first)):
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        found[mode] = decode_all(model, batches, search, incremental=mode == "incremental")
        record[f"{mode}_seconds"] = time.perf_counter() - started
        record[f"{mode}_load_1min"] = [load_before, os.getloadavg()[0]]
    record["same_hypotheses"] = found["whole"] == found["incremental"]
    record["mean_hypothesis_tokens"] = statistics.mean(len(h) for h in found["whole"])
    record["ratio_whole_over_incremental"] = record["whole_seconds"] / record["incremental_seconds"]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("smoke", "base"), default="smoke")
    parser.add_argument("--sentences", type=int, default=128, help="test sentences decoded per mode and round")
    parser.add_argument("--max-length", type=int, default=SMOKE.longest_test, help="tokens per hypothesis at most")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the raw rounds and the median ratio here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    recipe = SMOKE if args.shape == "smoke" else RECIPE_4B
    shape = recipe.shape
    assert isinstance(shape, TransformerShape)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic(Path(tmp), {"train": 10, "test": args.sentences}, seed=0)
        vocab = read_dictionary(root / "dict.txt")
        test = read_split(root, "test", vocab)
    search = {
        "bos": vocab.bos, "eos": vocab.eos, "max_length": args.max_length, "beam": recipe.beam,
        "length_penalty": recipe.length_penalty,
    }  # fmt: skip
    batches = [
        pad_batch(test.source[i : i + DECODE_BATCH], vocab.pad) for i in range(0, len(test.source), DECODE_BATCH)
    ]
    torch.manual_seed(0)
    model = Transformer(len(vocab), vocab.pad, shape).eval()
    decode_all(model, batches[:1], search, incremental=True)  # warm-up: allocator, kernels
    rounds = []
    for r in range(args.rounds):
        rounds.append(one_round(model, batches, search, MODES[r % 2]))
        last = rounds[-1]
        ratio, same, load = last["ratio_whole_over_incremental"], last["same_hypotheses"], last["whole_load_1min"]
        print(f"round {r}: whole / incremental {ratio:.2f}, same hypotheses {same}, load {load}", flush=True)
    ratio = statistics.median(r["ratio_whole_over_incremental"] for r in rounds)
    print(f"median whole / incremental over {args.rounds} paired rounds: {ratio:.2f}")
    if args.json:
        result = {
            "command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} {os.path.relpath(sys.executable)} "
            + " ".join(sys.argv),
            "note": "a 2-core machine shared with other engineers' test runs (loaded): the 1-minute load average "
            "before and after each timing is in its round; compare the paired ratios, not the seconds",
            "config": {
                "shape": args.shape,
                "d_model": shape.d_model,
                "decoder_layers": shape.decoder_layers,
                "vocab": len(vocab),
                "sentences": len(test.source),
                "max_length": args.max_length,
                "decode_batch": DECODE_BATCH,
                "beam": recipe.beam,
                "length_penalty": recipe.length_penalty,
                "torch_threads": torch.get_num_threads(),
            },
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
            "rounds": rounds,
            "median_ratio_whole_over_incremental": ratio,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
