"""The registry's algorithms on the translation kind: admission refuses the ones it has no loop for, and on two
gloo ranks each algorithm keeps its own invariant through the translation step (tiny fp64 Transformer)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from mlbench_api.catalog import get_task
from mlbench_api.config import AlgorithmNotAllowed, effective_config
from mlbench_api.results import RunSummary
from mlbench_api.run import BenchmarkRun
from mlbench_api.training import TRANSLATION_ALGORITHMS, Algorithm
from mlbench_runner.algorithms import make_algorithm
from mlbench_runner.algorithms.loop_step import AVERAGING
from mlbench_runner.comm import CountingCommunicator, TorchCommunicator, close_quietly
from mlbench_runner.options import TRACE_GOSSIP
from mlbench_runner.translation.algorithm_step import FUSED, MEAN_OVER_RANKS, algorithm_step
from mlbench_runner.translation.optim import LossScaler, accumulated_step

from .helpers import join_all, launch_processes, make_config, run_doc, spawn_ranks
from .test_translation import micro_batches, tiny_model

STEPS = 3


def admit(task: str, algorithm: str) -> Algorithm:
    run = BenchmarkRun.model_validate(run_doc("r", task, 2, algorithm=algorithm))
    return effective_config(run, task, get_task(task).spec).algorithm


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_admission_lets_a_translation_task_have_every_algorithm(algorithm: Algorithm) -> None:
    assert admit("synthetic-gnmt-smoke", algorithm.value) is algorithm
    assert algorithm in TRANSLATION_ALGORITHMS


def test_the_closed_translation_task_still_allows_all_reduce_only() -> None:
    with pytest.raises(AlgorithmNotAllowed, match=r"not allowed by this closed-division task"):
        admit("wmt17-transformer", "decentralized-sgd")


def train(comm: TorchCommunicator, algorithm: str | None, rank: int) -> tuple[list[float], LossScaler, list[int]]:
    """STEPS Adam steps of the tiny fp64 model on rank ``rank``'s own micro-batches (two per step), through the
    registry ``algorithm`` or the fused all-reduce (None); ddp: its reducer's all-reduces per step too."""
    pool = micro_batches(11, 4 * STEPS)
    model: torch.nn.Module = tiny_model().double().train()
    registry = None if algorithm is None else make_algorithm(algorithm, CountingCommunicator(comm), seed=0)
    reductions = [0]  #: DDP's bucket all-reduces in each step, the last entry the current step's
    if registry is not None:
        model = registry.prepare(model)
    if isinstance(model, DistributedDataParallel):
        model.register_comm_hook(reductions, counting_hook)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    scaler = LossScaler()
    for step in range(STEPS):
        mine = [pool[4 * step + 2 * rank], pool[4 * step + 2 * rank + 1]]
        options = {"lr": 1e-3 * (step + 1), "pad": 0, "smoothing": 0.1, "clip_norm": 5.0}
        if registry is None:
            accumulated_step(model, optimizer, mine, comm, scaler, **options)  # type: ignore[arg-type]
        else:
            algorithm_step(model, optimizer, mine, comm, scaler, algorithm=registry, **options)  # type: ignore[arg-type]
        reductions.append(0)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(), scaler, reductions[:-1]


def counting_hook(state, bucket):  # unannotated: DDP refuses string annotations (__future__)
    """DDP's own all-reduce of a bucket (the mean over ranks), counted into the current step's ``state[-1]``."""
    state[-1] += 1
    return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]


def _rank(rank: int, port: int, out: str, algorithm: str) -> None:
    from mlbench_runner.world import World

    torch.set_num_threads(1)
    if algorithm == Algorithm.DECENTRALIZED_SGD.value:
        os.environ[TRACE_GOSSIP.env] = out
    comm = TorchCommunicator(World(rank, 2, rank, 2, "127.0.0.1", port, "env"), "gloo")
    params, scaler, reductions = train(comm, algorithm, rank)
    exact, _, _ = train(comm, None, rank) if algorithm in MEAN_OVER_RANKS else ([], None, [])
    close_quietly(comm, True)
    record = {"params": params, "exact": exact, "skipped": scaler.skipped, "scale": scaler.scale}
    record["reductions"] = reductions
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))


def run_ranks(tmp_path: Path, algorithm: str) -> list[dict[str, object]]:
    join_all(spawn_ranks(_rank, str(tmp_path), algorithm), timeout=150)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.multiproc
@pytest.mark.timeout(180)
@pytest.mark.parametrize("algorithm", sorted(AVERAGING))
def test_a_gradient_averaging_algorithm_keeps_the_ranks_equal_and_compresses(tmp_path: Path, algorithm: str) -> None:
    """Every rank applies the same synchronized gradient: the parameters agree bit for bit; the compression makes
    them differ from the fused all-reduce's on the same batches (which agree too), and the steps moved them."""
    ranks = run_ranks(tmp_path, algorithm)
    params = [torch.tensor(r["params"], dtype=torch.float64) for r in ranks]
    exact = torch.tensor(ranks[0]["exact"], dtype=torch.float64)
    torch.testing.assert_close(params[0], params[1], rtol=0, atol=0)
    torch.testing.assert_close(exact, torch.tensor(ranks[1]["exact"], dtype=torch.float64), rtol=0, atol=0)
    untrained = torch.cat([p.detach().reshape(-1) for p in tiny_model().double().parameters()])
    assert not torch.allclose(params[0], untrained)
    assert not torch.allclose(params[0], exact, rtol=0, atol=1e-9)
    assert [r["skipped"] for r in ranks] == [0, 0]


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_decentralized_sgd_steps_on_the_own_gradient_then_averages_with_the_neighbour(tmp_path: Path) -> None:
    """Two ranks on a ring: each takes its own local step (different), then both hold the mean of the two local
    models (W = [[1/2, 1/2], [1/2, 1/2]]); the next step starts from that mean."""
    ranks = run_ranks(tmp_path, Algorithm.DECENTRALIZED_SGD.value)
    traces = [
        [json.loads(line) for line in (tmp_path / f"gossip-rank-{r}.jsonl").read_text().splitlines()] for r in (0, 1)
    ]
    assert [len(t) for t in traces] == [STEPS, STEPS]
    for step in range(STEPS):
        local = [torch.tensor(t[step]["local"], dtype=torch.float64) for t in traces]
        start = torch.tensor(traces[0][step]["start"], dtype=torch.float64)
        assert not torch.allclose(local[0], local[1])  # each rank stepped on its own micro-batches
        assert not torch.allclose(local[0], start)
        for t in traces:
            mixed = torch.tensor(t[step]["mixed"], dtype=torch.float64)
            torch.testing.assert_close(mixed, (local[0] + local[1]) / 2, rtol=0, atol=1e-12)
            if step + 1 < STEPS:
                assert t[step + 1]["start"] == t[step]["mixed"]
    assert ranks[0]["params"] == traces[0][-1]["mixed"] == traces[1][-1]["mixed"]


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_the_runner_command_trains_a_translation_task_with_powersgd_and_counts_its_bytes(tmp_path: Path) -> None:
    """``mlbench-runner train`` on two gloo ranks runs the transformer smoke task (one epoch of a smaller corpus)
    through powersgd: the summary names it and carries its declared bytes per step next to the counted ones."""
    task = get_task("synthetic-transformer-smoke").spec.to_api()
    task["dataset"]["synthetic"]["trainSamples"] = 600
    task["dataset"]["synthetic"]["testSamples"] = 20
    task["training"]["maxEpochs"] = 1
    config = make_config(task, tmp_path / "out", 2, algorithm="powersgd")
    launch_processes(config, 2, timeout=240)
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    assert summary.environment is not None
    assert summary.environment.algorithm == "powersgd"
    assert summary.steps > 0
    assert summary.communication is not None
    record = summary.communication
    assert record.collectives == ["all-reduce"]
    assert record.measured_bytes_per_step == record.bytes_per_step
    assert record.compression_ratio is not None
    assert record.compression_ratio > 2


def test_the_fused_step_serves_the_all_reduce_algorithms_only() -> None:
    assert {Algorithm(a) for a in FUSED} == {Algorithm.ALLREDUCE_SGD, Algorithm.CENTRALIZED_ADAM}
    assert {Algorithm(a) for a in FUSED | MEAN_OVER_RANKS} | {Algorithm.DECENTRALIZED_SGD} == set(Algorithm)


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_ddp_all_reduces_once_per_accumulated_step_and_takes_the_fused_step(tmp_path: Path) -> None:
    """Two micro-batches per step, the first under ``no_sync()``: DDP's reducer runs once per step (the tiny
    model is one bucket: under DDP's first-bucket cap), and the parameters are the fused all-reduce's up to
    rounding (DDP averages, then the step deflates by scale * all tokens / world), equal on both ranks."""
    assert sum(p.numel() * 8 for p in tiny_model().parameters()) < dist._DEFAULT_FIRST_BUCKET_BYTES
    ranks = run_ranks(tmp_path, Algorithm.DDP.value)
    assert [r["reductions"] for r in ranks] == [[1] * STEPS, [1] * STEPS]
    params = [torch.tensor(r["params"], dtype=torch.float64) for r in ranks]
    torch.testing.assert_close(params[0], params[1], rtol=0, atol=0)
    exact = torch.tensor(ranks[0]["exact"], dtype=torch.float64)
    torch.testing.assert_close(params[0], exact, rtol=1e-9, atol=1e-12)
    untrained = torch.cat([p.detach().reshape(-1) for p in tiny_model().double().parameters()])
    assert not torch.allclose(params[0], untrained)
    assert [r["skipped"] for r in ranks] == [0, 0]


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_the_runner_command_trains_a_translation_task_with_ddp(tmp_path: Path) -> None:
    """``mlbench-runner train`` on two gloo ranks runs the transformer smoke task (one epoch of a smaller corpus)
    under ddp: it trains and evaluates (the unwrapped network, no collective per batch), and the summary declares
    the reference's bytes per step with none measured (DDP's reducer talks to the process group itself)."""
    task = get_task("synthetic-transformer-smoke").spec.to_api()
    task["dataset"]["synthetic"]["trainSamples"] = 600
    task["dataset"]["synthetic"]["testSamples"] = 20
    task["training"]["maxEpochs"] = 1
    config = make_config(task, tmp_path / "out", 2, algorithm="ddp")
    ranks = launch_processes(config, 2, timeout=240)
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    assert summary.environment is not None
    assert summary.environment.algorithm == "ddp"
    assert summary.steps > 0
    assert [r["steps"] for r in ranks] == [summary.steps, summary.steps]
    assert len(summary.history) == 1
    assert summary.history[0].score is not None
    assert summary.communication is not None
    assert summary.communication.collectives == ["all-reduce"]
    assert summary.communication.bytes_per_step > 0
    assert summary.communication.measured_bytes_per_step is None
    assert summary.communication.compression_ratio == 1.0
