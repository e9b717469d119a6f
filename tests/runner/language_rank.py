"""One rank of the language-modelling smoke recipe, as mpirun starts it (the mpi4py backend's test):

mpirun -np 2 python -m tests.runner.language_rank <data folder> <output folder> <backend>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from mlbench_runner.comm import close_quietly, make_communicator
from mlbench_runner.language.corpus import read_corpus
from mlbench_runner.language.loop import SMOKE, LanguageResult, train_language
from mlbench_runner.world import detect_world


def smoke_record(result: LanguageResult) -> dict[str, object]:
    """What a rank of the smoke run reports to the test."""
    return {
        "scores": [h.score for h in result.history],
        "wall": [h.wall_seconds for h in result.history],
        "reached": result.reached,
        "steps": result.steps,
        "test_perplexity": result.test_perplexity,
        "averaging_from_epoch": result.averaging_from_epoch,
    }


def main() -> None:
    root, out, backend = sys.argv[1:4]
    torch.set_num_threads(1)
    comm = make_communicator(detect_world(), backend)
    result = train_language(read_corpus(Path(root)), SMOKE, comm, seed=0)
    (Path(out) / f"rank{comm.rank}.json").write_text(json.dumps(smoke_record(result)))
    close_quietly(comm, True)


if __name__ == "__main__":
    main()
