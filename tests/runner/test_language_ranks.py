"""Task 3a's rule across two ranks: two ranks of b streams take one rank's step on 2b streams, and the smoke recipe
reaches its perplexity goal on the synthetic corpus (NOT WikiText-2) on a CPU through gloo, mpi and the runner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlbench_api.catalog import get_task
from mlbench_api.results import RunSummary
from mlbench_api.training import Algorithm
from mlbench_runner.comm import Communicator, LocalCommunicator, TorchCommunicator, close_quietly
from mlbench_runner.language.corpus import batchify, read_corpus, write_synthetic
from mlbench_runner.language.loop import SMOKE, LanguageRecipe, default_algorithm, train_language, train_window, trainee
from mlbench_runner.language.model import AwdLstm, AwdLstmShape
from mlbench_runner.language.task import run as run_language

from .helpers import env, join_all, launch_processes, make_config, spawn_ranks
from .language_rank import smoke_record

WINDOWS = 3
#: No dropout anywhere: the steps are then the same arithmetic on one rank and on two.
PLAIN = AwdLstmShape(
    embedding=6, hidden=10, layers=2, dropout=0, dropout_hidden=0, dropout_input=0, dropout_embedding=0, weight_drop=0
)
PARITY = LanguageRecipe(shape=PLAIN, bptt=5, rate=2.0, clip=0.5, alpha=2.0, beta=1.0, weight_decay=1e-3)


def train_steps(comm: Communicator, streams: int) -> list[float]:
    """WINDOWS steps of the fp64 model on this rank's ``streams`` streams of a fixed token sequence."""
    ids = torch.arange(400) * 7 % 23
    torch.manual_seed(0)
    t = trainee(AwdLstm(23, PLAIN).double().train(), PARITY, default_algorithm(comm))
    data = batchify(ids, streams, comm.rank, comm.size)
    hidden = t.model.init_hidden(streams)
    for w in range(WINDOWS):
        words, target = data[w * 5 : w * 5 + 5], data[w * 5 + 1 : w * 5 + 6]
        hidden, _, _, _ = train_window(t, words, target, hidden, recipe=PARITY, lr=PARITY.rate)
    return torch.cat([p.detach().reshape(-1) for p in t.params]).tolist()


def _parity_rank(rank: int, port: int, out: str) -> None:
    from mlbench_runner.world import World

    comm = TorchCommunicator(World(rank, 2, rank, 2, "127.0.0.1", port, "env"), "gloo")
    params = train_steps(comm, 3)
    close_quietly(comm, True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(params))


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_two_ranks_of_b_streams_take_one_ranks_step_on_2b_streams(tmp_path: Path) -> None:
    """Mean loss, AR and TAR per rank, averaged gradient, clipping after the average: the same update."""
    join_all(spawn_ranks(_parity_rank, str(tmp_path)), timeout=150)
    ranks = [torch.tensor(json.loads((tmp_path / f"rank{r}.json").read_text()), dtype=torch.float64) for r in (0, 1)]
    alone = torch.tensor(train_steps(LocalCommunicator("gloo"), 6), dtype=torch.float64)
    torch.testing.assert_close(ranks[0], ranks[1], rtol=0, atol=0)
    torch.testing.assert_close(ranks[0], alone, rtol=1e-9, atol=1e-12)
    torch.manual_seed(0)
    untrained = torch.cat([p.detach().reshape(-1) for p in AwdLstm(23, PLAIN).double().parameters()])
    assert not torch.allclose(alone, untrained)


def synthetic(tmp_path: Path) -> Path:
    return write_synthetic(tmp_path / "synthetic", {"train": 2000, "valid": 200, "test": 200}, seed=0)


def _smoke_rank(rank: int, port: int, root: str, out: str) -> None:
    from mlbench_runner.world import World

    torch.set_num_threads(1)
    comm = TorchCommunicator(World(rank, 2, rank, 2, "127.0.0.1", port, "env"), "gloo")
    result = train_language(read_corpus(Path(root)), SMOKE, comm, seed=0)
    close_quietly(comm, True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(smoke_record(result)))


def check_smoke(out: Path) -> None:
    """Both ranks' records: from far above the goal to it, judged alike on every rank."""
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    first = ranks[0]
    print("perplexity per epoch", first["scores"], "seconds", first["wall"], "test", first["test_perplexity"])
    assert first["reached"]
    assert first["scores"][0] > 2 * SMOKE.goal.target >= 2 * first["scores"][-1]
    assert first["scores"][-1] <= SMOKE.goal.target
    assert ranks[1]["scores"] == first["scores"]
    assert ranks[1]["steps"] == first["steps"]
    assert first["test_perplexity"] < 2 * SMOKE.goal.target


@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_the_smoke_recipe_reaches_its_perplexity_goal_with_two_gloo_ranks(tmp_path: Path) -> None:
    join_all(spawn_ranks(_smoke_rank, str(synthetic(tmp_path)), str(tmp_path)), timeout=540)
    check_smoke(tmp_path)


@pytest.mark.multiproc
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed on this machine")
def test_the_smoke_recipe_reaches_its_perplexity_goal_with_two_mpi_ranks(tmp_path: Path) -> None:
    root = synthetic(tmp_path)
    root_flag = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = ["mpirun", "-np", "2", "--oversubscribe", *root_flag, sys.executable, "-m", "tests.runner.language_rank"]
    proc = subprocess.run(
        [*cmd, str(root), str(tmp_path), "mpi"], env=env(), capture_output=True, text=True, timeout=540, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_smoke(tmp_path)


@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_the_catalog_smoke_task_trains_to_its_goal_under_the_runner_command(tmp_path: Path) -> None:
    """``mlbench-runner train`` on two gloo ranks runs an awd-lstm task through the language kind; rank 0's summary
    carries validation perplexity per epoch, and events.jsonl the test split's perplexity."""
    config = make_config(get_task("synthetic-awd-lstm-smoke").spec.to_api(), tmp_path / "out", 2)
    ranks = launch_processes(config, 2, timeout=540)
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    print("scores", [h.score for h in summary.history], "wall", summary.wall_clock_seconds)
    assert (summary.status, summary.stop_reason, summary.goal_reached) == ("success", "goal", True)
    assert summary.goal_metric == "perplexity"
    assert summary.final_score is not None
    assert summary.final_score <= 7.0
    assert summary.history[0].score is not None
    assert summary.history[0].score > 14.0
    assert summary.communication_seconds > 0
    assert [r["steps"] for r in ranks] == [summary.steps, summary.steps]
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    evaluations = [e for e in events if e["event"] == "eval_accuracy"]
    assert [e["score"] for e in evaluations] == [h.score for h in summary.history]
    assert {e["metric"] for e in evaluations} == {"perplexity"}
    (test,) = [e for e in events if e["event"] == "test_perplexity"]
    assert 1.0 < test["perplexity"] < 14.0
    assert events[-1]["event"] == "run_summary"


def test_another_algorithm_is_refused_by_name(tmp_path: Path) -> None:
    """Admission refuses it (tests/runner/test_language_algorithms.py); a config that got past it anyway is
    refused by the runner too."""
    config = make_config(get_task("synthetic-awd-lstm-smoke").spec.to_api(), tmp_path / "out", 1)
    config = config.model_copy(update={"algorithm": Algorithm.CENTRALIZED_ADAM})
    runs = "allreduce-sgd, powersgd, sign-sgd, sparsified-sgd, decentralized-sgd only, not centralized-adam"
    with pytest.raises(ValueError, match=f"algorithm: an awd-lstm task runs {runs}"):
        run_language(config)
