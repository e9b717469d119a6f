"""The GNMT smoke task (the catalog's synthetic-gnmt-smoke) trained to its goal on two gloo ranks: as it is
(``after``: SMOKE_GNMT, beam search decoding GNMT one token at a time) and as it was (``before``: 64 sentences per
step, peak rate 3e-3, test length 32, the decoder re-run over the whole prefix at every step).

Both train the same model size on the same data with the same seed and goal (SMOKE_GNMT's: 8 BLEU until the
mpi test came, 6 since; the committed 2026-11-29-gnmt-smoke.json ran with 8); they alternate in rounds (a
noisy neighbour slows both alike). Per run: the wall seconds from spawn to the last rank's exit, the seconds rank
0 spent in beam search, BLEU per epoch and whether the goal was met. The table prints the median ratio
before / after.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gnmt_smoke_cpu.py --rounds 1 --json benchmarks/results/x.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

import torch

from mlbench_runner.comm import TorchCommunicator, close_quietly
from mlbench_runner.translation import loop
from mlbench_runner.translation.corpus import write_synthetic
from mlbench_runner.translation.decoding import beam_search
from mlbench_runner.world import World, free_port

MODES = ("before", "after")
#: The smoke recipe before it was made faster (what the catalog task said until then).
BEFORE = dataclasses.replace(loop.SMOKE_GNMT, sentences_per_step=64, max_sentences=32, peak_lr=3e-3, test_max_length=32)


def _rank(rank: int, port: int, root: str, out: str, mode: str) -> None:
    torch.set_num_threads(1)
    search = functools.partial(beam_search, incremental=mode == "after")
    spent = [0.0]

    def timed(*args: object, **kwargs: object) -> list[list[int]]:
        started = time.perf_counter()
        hypotheses = search(*args, **kwargs)  # type: ignore[arg-type]
        spent[0] += time.perf_counter() - started
        return hypotheses

    loop.beam_search = timed
    comm = TorchCommunicator(World(rank, 2, rank, 2, "127.0.0.1", port, "env"), "gloo")
    recipe = loop.SMOKE_GNMT if mode == "after" else BEFORE
    result = loop.train_translation(Path(root), recipe, comm, seed=0)
    close_quietly(comm, True)
    record = {"bleu": [h.score for h in result.history], "reached": result.reached, "decode_seconds": spent[0]}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))


def one_run(root: Path, mode: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as out:
        ctx = multiprocessing.get_context("spawn")
        port = free_port()
        started = time.perf_counter()
        procs = [ctx.Process(target=_rank, args=(r, port, str(root), out, mode)) for r in (0, 1)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        wall = time.perf_counter() - started
        if any(p.exitcode != 0 for p in procs):
            raise SystemExit(f"{mode}: a rank failed")
        record = json.loads((Path(out) / "rank0.json").read_text())
    return {"mode": mode, "wall_seconds": wall, **record}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the raw runs and the ratio here")
    args = parser.parse_args()
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as data:
        root = write_synthetic(Path(data), {"train": 3000, "test": 200}, seed=0)  # the catalog task's corpus
        for _ in range(args.rounds):
            for mode in MODES:
                runs.append(one_run(root, mode))
                print(json.dumps(runs[-1]), flush=True)
    walls = {m: [float(r["wall_seconds"]) for r in runs if r["mode"] == m] for m in MODES}  # type: ignore[arg-type]
    ratio = statistics.median(walls["before"]) / statistics.median(walls["after"])
    print(f"{'mode':14} {'median wall s':>14}")
    for mode in MODES:
        print(f"{mode:14} {statistics.median(walls[mode]):14.1f}")
    print(f"before / after: {ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "ratio_before_over_after": ratio}, indent=2) + "\n")


if __name__ == "__main__":
    main()
