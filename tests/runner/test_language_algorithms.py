"""The registry's algorithms on the language-model kind (awd-lstm): admission lets through the ones its loop runs,
and on two gloo ranks each keeps its invariant through the AWD-LSTM window (tiny fp64 model, no dropout), with the
recipe's clip and the averaged-SGD average running alongside."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mlbench_api.catalog import get_task
from mlbench_api.config import AlgorithmNotAllowed, effective_config
from mlbench_api.results import RunSummary
from mlbench_api.run import BenchmarkRun
from mlbench_api.training import LANGUAGE_MODEL_ALGORITHMS, Algorithm
from mlbench_runner.algorithms import make_algorithm
from mlbench_runner.algorithms.loop_step import AVERAGING, StepBytes
from mlbench_runner.comm import CountingCommunicator, TorchCommunicator, close_quietly
from mlbench_runner.language.corpus import batchify
from mlbench_runner.language.loop import LanguageRecipe, Trainee, train_window, trainee
from mlbench_runner.language.model import AwdLstm

from .helpers import join_all, launch_processes, make_config, run_doc, spawn_ranks
from .test_language_ranks import PLAIN

WINDOWS = 4
#: Averaging starts after this many windows, so the last ones also update the NT-ASGD average.
AVERAGE_FROM = 2
SMOKE_TASK = "synthetic-awd-lstm-smoke"


def admit(algorithm: str) -> Algorithm:
    run = BenchmarkRun.model_validate(run_doc("r", SMOKE_TASK, 2, algorithm=algorithm))
    return effective_config(run, SMOKE_TASK, get_task(SMOKE_TASK).spec).algorithm


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_admission_lets_an_awd_lstm_task_have_every_algorithm_but_ddp_and_centralized_adam(
    algorithm: Algorithm,
) -> None:
    if algorithm in (Algorithm.DDP, Algorithm.CENTRALIZED_ADAM):
        refused = rf"^spec\.algorithm: {algorithm.value} has no training loop for a awd-lstm task .*runs: allreduce-sgd"
        with pytest.raises(AlgorithmNotAllowed, match=refused):
            admit(algorithm.value)
        assert algorithm not in LANGUAGE_MODEL_ALGORITHMS
    else:
        assert admit(algorithm.value) is algorithm
        assert algorithm in LANGUAGE_MODEL_ALGORITHMS


def recipe(clip: float) -> LanguageRecipe:
    return LanguageRecipe(shape=PLAIN, bptt=5, rate=2.0, clip=clip, alpha=2.0, beta=1.0, weight_decay=1e-3)


def train(comm: TorchCommunicator, algorithm: str, clip: float) -> dict[str, Any]:
    """WINDOWS windows of the tiny fp64 model on this rank's 3 streams through ``algorithm``; the average starts
    after AVERAGE_FROM. The parameters, the average, and the bytes declared and counted."""
    ids = torch.arange(400) * 7 % 23
    torch.manual_seed(0)
    r = recipe(clip)
    t: Trainee = trainee(AwdLstm(23, PLAIN).double().train(), r, make_algorithm(algorithm, CountingCommunicator(comm)))
    sent = StepBytes(t.algorithm.plan(t.model))
    data = batchify(ids, 3, comm.rank, comm.size)
    hidden = t.model.init_hidden(3)
    for w in range(WINDOWS):
        if w == AVERAGE_FROM:
            t.average.start(t.params)
        words, target = data[w * 5 : w * 5 + 5], data[w * 5 + 1 : w * 5 + 6]
        hidden, _, _, _ = train_window(t, words, target, hidden, recipe=r, lr=r.rate * (w + 1) / WINDOWS, sent=sent)
    assert t.average.average is not None
    record = sent.record(WINDOWS)
    assert record is not None
    return {
        "params": torch.cat([p.detach().reshape(-1) for p in t.params]).tolist(),
        "average": torch.cat([a.reshape(-1) for a in t.average.average]).tolist(),
        "declared": record.bytes_per_step,
        "measured": record.measured_bytes_per_step,
    }


def _rank(rank: int, port: int, out: str, runs: list[tuple[str, float]]) -> None:
    from mlbench_runner.world import World

    torch.set_num_threads(1)
    comm = TorchCommunicator(World(rank, 2, rank, 2, "127.0.0.1", port, "env"), "gloo")
    records = [train(comm, algorithm, clip) for algorithm, clip in runs]
    close_quietly(comm, True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(records))


def run_ranks(tmp_path: Path, runs: list[tuple[str, float]]) -> list[list[dict[str, Any]]]:
    """Each rank's records of ``runs`` (algorithm, clip), trained one after the other in one pair of processes."""
    join_all(spawn_ranks(_rank, str(tmp_path), runs), timeout=240)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def tensor(values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


#: Small enough that the tiny model's gradients are clipped (the recipe's 0.25 is for the 33M-parameter model).
CLIP = 0.01
EXACT = Algorithm.ALLREDUCE_SGD.value


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_gradient_averaging_algorithm_keeps_the_ranks_and_their_averages_equal(tmp_path: Path) -> None:
    """Every rank applies the same synchronized, clipped gradient: parameters and NT-ASGD averages agree bit for
    bit; the compression makes them differ from exact all-reduce's on the same windows; bytes counted = declared."""
    names = sorted(AVERAGING)
    ranks = run_ranks(tmp_path, [(EXACT, CLIP)] + [(name, CLIP) for name in names])
    exact = tensor(ranks[0][0]["params"])
    torch.manual_seed(0)
    untrained = torch.cat([p.detach().reshape(-1) for p in AwdLstm(23, PLAIN).double().parameters()])
    assert not torch.allclose(exact, untrained)
    for index, name in enumerate(names, start=1):
        runs = [r[index] for r in ranks]
        for key in ("params", "average"):
            torch.testing.assert_close(tensor(runs[0][key]), tensor(runs[1][key]), rtol=0, atol=0, msg=name)
        params = tensor(runs[0]["params"])
        assert not torch.allclose(params, exact, rtol=0, atol=1e-9), name
        assert not torch.allclose(params, untrained), name
        assert not torch.allclose(tensor(runs[0]["average"]), params), name
        assert runs[0]["declared"] < ranks[0][0]["declared"], name  # compressed
    for r in ranks:
        for run in r:
            assert isinstance(run["declared"], int)
            assert run["declared"] > 0
            assert run["measured"] == run["declared"]


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_decentralized_sgd_on_two_ranks_is_the_all_reduce_step_but_for_the_clip_of_the_own_gradient(
    tmp_path: Path,
) -> None:
    """Two ranks on a ring mix with W = [[1/2, 1/2], [1/2, 1/2]], so after each gossip both hold the mean of their
    local SGD steps from one point: without clipping, the all-reduce step on the mean gradient (up to rounding); the
    recipe's clip applies to each rank's own gradient, so with it the steps differ. Bytes counted = declared."""
    gossip = Algorithm.DECENTRALIZED_SGD.value
    ranks = run_ranks(tmp_path, [(gossip, CLIP), (EXACT, CLIP), (gossip, 1e9), (EXACT, 1e9)])
    for index in (0, 2):
        runs = [r[index] for r in ranks]
        for key in ("params", "average"):
            torch.testing.assert_close(tensor(runs[0][key]), tensor(runs[1][key]), rtol=0, atol=1e-12)
        for run in runs:
            assert run["measured"] == run["declared"] == ranks[0][index + 1]["declared"]  # one model per step
    clipped, clipped_exact = tensor(ranks[0][0]["params"]), tensor(ranks[0][1]["params"])
    assert not torch.allclose(clipped, clipped_exact, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(tensor(ranks[0][2]["params"]), tensor(ranks[0][3]["params"]), rtol=1e-9, atol=1e-12)
    assert not torch.allclose(clipped_exact, tensor(ranks[0][3]["params"]))  # the clip was active


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_the_runner_command_trains_an_awd_lstm_task_with_sparsified_sgd_and_counts_its_bytes(tmp_path: Path) -> None:
    """``mlbench-runner train`` on two gloo ranks runs the awd-lstm smoke task (two epochs of a smaller corpus)
    through sparsified-sgd: the summary names it, carries its declared bytes per step next to the counted ones, and
    perplexity falls."""
    task = get_task(SMOKE_TASK).spec.to_api()
    task["dataset"]["synthetic"]["trainSamples"] = 400
    task["dataset"]["synthetic"]["testSamples"] = 50
    task["training"]["maxEpochs"] = 2
    config = make_config(task, tmp_path / "out", 2, algorithm="sparsified-sgd")
    launch_processes(config, 2, timeout=240)
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    assert summary.environment is not None
    assert summary.environment.algorithm == "sparsified-sgd"
    assert summary.steps > 0
    assert summary.communication is not None
    record = summary.communication
    assert record.collectives == ["all-gather"]
    assert record.measured_bytes_per_step == record.bytes_per_step
    assert record.compression_ratio is not None
    assert record.compression_ratio > 10
    scores = [h.score for h in summary.history]
    assert len(scores) == 2
    assert scores[0] is not None
    assert scores[1] is not None
    assert scores[1] < scores[0]
