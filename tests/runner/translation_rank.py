"""One rank of the translation smoke recipe, as mpirun starts it (the mpi4py backend's test):

mpirun -np 2 python -m tests.runner.translation_rank <data folder> <output folder> <backend>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from mlbench_runner.comm import close_quietly, make_communicator
from mlbench_runner.translation.loop import SMOKE, TranslationResult, train_translation
from mlbench_runner.world import detect_world


def smoke_record(result: TranslationResult) -> dict[str, object]:
    """What a rank of the smoke run reports to the test."""
    return {
        "bleu": [h.bleu for h in result.history],
        "wall": [h.wall_seconds for h in result.history],
        "reached": result.reached,
        "steps": result.steps,
        "update_freq": result.update_freq,
        "skipped": result.skipped_steps,
        "signature": result.signature,
        "hypotheses": result.hypotheses,
    }


def main() -> None:
    root, out, backend = sys.argv[1:4]
    torch.set_num_threads(1)
    comm = make_communicator(detect_world(), backend)
    result = train_translation(Path(root), SMOKE, comm, seed=0)
    (Path(out) / f"rank{comm.rank}.json").write_text(json.dumps(smoke_record(result)))
    close_quietly(comm, True)


if __name__ == "__main__":
    main()
