"""sign-sgd and sparsified-sgd: the pure kernels, simulated ranks in threads, and real gloo/mpirun runs."""

from __future__ import annotations

import copy
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from mlbench_api import BenchmarkTaskSpec
from mlbench_api.parameters import AlgorithmParameters, Selection
from mlbench_api.results import RunSummary
from mlbench_runner.algorithms import make_algorithm
from mlbench_runner.algorithms.base import ceil_fraction
from mlbench_runner.algorithms.compressed import (
    INT8_MAX_RANKS,
    SparsifiedSGD,
    majority_vote,
    random_indices,
    random_k_seed,
    sign_votes,
    sparsify,
    vote_dtype,
)
from mlbench_runner.comm import CountingCommunicator, LocalCommunicator, MpiCommunicator
from mlbench_runner.data import load_dataset
from mlbench_runner.rank.models import build_model
from mlbench_runner.timing import PhaseTimer

from .helpers import launch_processes, logreg_task, make_config, read_ranks, resnet_task, write_cifar_python
from .threadcomm import on_ranks

pytestmark = pytest.mark.timeout(300)

SELECTIONS = [Selection.TOP_K, Selection.RANDOM_K]


def scatter(n: int, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return torch.zeros(n, dtype=values.dtype).index_put_((indices,), values)


# -- the pure kernels ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize(("n", "k"), [(1000, 10), (1000, 1), (64, 40), (7, 7)])
def test_error_feedback_loses_nothing(selection: Selection, dtype: torch.dtype, n: int, k: int) -> None:
    """memory_new + sent == grad + memory_old, bit for bit; the sent entries leave the memory."""
    g = torch.Generator().manual_seed(n + k)
    grad = torch.randn(n, generator=g, dtype=dtype)
    memory = torch.randn(n, generator=g, dtype=dtype) * 0.1
    acc = grad + memory
    before = acc.clone()
    sent = sparsify(acc, k, selection, torch.Generator().manual_seed(5))
    assert torch.equal(acc, before), "sparsify modified its input"
    assert sent.values.dtype == dtype
    assert sent.memory.dtype == dtype
    assert sent.indices.numel() == k
    assert sent.indices.unique().numel() == k, "an index chosen twice would be sent twice"
    assert torch.equal(sent.values, acc[sent.indices])
    assert torch.equal(sent.memory[sent.indices], torch.zeros(k, dtype=dtype))
    assert torch.equal(sent.memory + scatter(n, sent.indices, sent.values), grad + memory)
    kept = torch.ones(n, dtype=torch.bool)
    kept[sent.indices] = False
    assert torch.equal(sent.memory[kept], acc[kept]), "unsent entries must stay in the memory unchanged"


def test_top_k_takes_the_largest_magnitudes_whatever_their_sign() -> None:
    n, k = 500, 7
    acc = torch.randn(n, generator=torch.Generator().manual_seed(1)).clamp(-1, 1)
    big = torch.tensor([3, 77, 150, 222, 301, 420, 499])
    acc[big] = torch.tensor([-9.0, 5.0, -4.0, 8.0, -2.5, 3.0, 2.0])
    sent = sparsify(acc, k, Selection.TOP_K)
    assert sorted(sent.indices.tolist()) == big.tolist()
    k2 = 3  # the three largest |acc| are -9, 8, 5: negative ones count by magnitude
    assert sorted(sparsify(acc, k2, "top-k").indices.tolist()) == [3, 77, 222]
    rest = sent.memory.abs().max()
    assert sent.values.abs().min() >= rest


def test_random_k_is_a_function_of_seed_and_step_and_uniform() -> None:
    def draw(n: int, k: int, seed: int, step: int) -> list[int]:
        return random_indices(n, k, torch.Generator().manual_seed(random_k_seed(seed, step))).tolist()

    for n, k in [(10_000, 25), (100, 60)]:  # the sparse draw and the permutation
        a = draw(n, k, 42, 3)
        assert a == draw(n, k, 42, 3), "two ranks with the same seed and step must choose the same indices"
        assert a == sorted(set(a))
        assert len(a) == k
        assert a[0] >= 0
        assert a[-1] < n
        assert a != draw(n, k, 42, 4), "every step draws anew"
        assert a != draw(n, k, 43, 3), "every seed draws anew"
    # Uniform over positions: 3000 draws of 5 of 100 hit each index ~150 times (fixed seeds: deterministic).
    counts = np.bincount(np.concatenate([draw(100, 5, 7, s) for s in range(3000)]), minlength=100)
    assert counts.min() > 90, counts
    assert counts.max() < 220, counts


@pytest.mark.parametrize(
    ("n", "density", "k"),
    [(269_722, 0.01, 2698), (1000, 0.01, 10), (1001, 0.01, 11), (20, 0.01, 1), (10, 1.0, 10), (3, 0.5, 2)],
)
def test_k_is_ceil_density_times_n_within_bounds(n: int, density: float, k: int) -> None:
    assert ceil_fraction(n, density) == k == max(1, min(n, math.ceil(density * n)))
    model = nn.Linear(n, 1, bias=False)
    algo = make_algorithm("sparsified-sgd", LocalCommunicator("gloo"), parameters=AlgorithmParameters(density=density))
    algo.prepare(model)
    assert isinstance(algo, SparsifiedSGD)
    assert algo.k == k


def test_sign_majority_vote_table() -> None:
    # columns are parameters; rows are ranks. Magnitudes do not count, zeros abstain, ties give 0.
    grads = torch.tensor(
        [
            [+1.0, +2.0, -1.0, -5.0, +100.0, +1.0, 0.0, 0.0, +3.0],
            [+1.0, -0.1, -1.0, -5.0, -1.0, 0.0, 0.0, +1.0, -3.0],
            [+1.0, +0.5, +1.0, -5.0, -1.0, -1.0, 0.0, 0.0, 0.0],
        ]
    )
    expected = [+1.0, +1.0, -1.0, -1.0, -1.0, 0.0, 0.0, +1.0, 0.0]
    votes = torch.stack([sign_votes(g) for g in grads])
    assert votes.dtype == torch.int8
    assert majority_vote(votes.sum(0, dtype=torch.int8), torch.float32).tolist() == expected
    two = torch.stack([sign_votes(torch.tensor([1.0, -2.0, 3.0])), sign_votes(torch.tensor([-1.0, -1.0, 0.0]))])
    assert majority_vote(two.sum(0, dtype=torch.int8), torch.float32).tolist() == [0.0, -1.0, 1.0]


def test_vote_dtype_cannot_overflow() -> None:
    local = LocalCommunicator("gloo")
    mpi = object.__new__(MpiCommunicator)  # only its type matters
    assert vote_dtype(2, local) == vote_dtype(INT8_MAX_RANKS, mpi) == torch.int8
    # 128 unanimous int8 votes wrap around to the wrong sign: that is why a wider type takes over.
    assert torch.ones(128, dtype=torch.int8).sum(dtype=torch.int8).item() == -128
    assert vote_dtype(INT8_MAX_RANKS + 1, mpi) == torch.int16  # OpenMPI sums int16
    assert vote_dtype(INT8_MAX_RANKS + 1, local) == torch.float16  # gloo refuses int16, NCCL has none
    assert vote_dtype(2048, local) == torch.float16
    assert vote_dtype(2049, local) == torch.int32
    # float16 running sums of +-1 stay exact up to 2048 (the transports add one rank at a time), not beyond.
    total = torch.zeros((), dtype=torch.float16)
    for _ in range(2048):
        total += 1
    assert total.item() == 2048
    total += 1
    assert total.item() == 2048  # 2049 is not representable: more ranks would miscount


# -- simulated ranks: one thread each (tests/runner/threadcomm.py) ----------------------------------------------


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 2))  # 18 + 8 = 26 parameters


def synchronize_steps(
    rank: int, comm: CountingCommunicator, name: str, grads: list[list[torch.Tensor]], **params: Any
) -> dict[str, Any]:
    """Prepare ``name`` on this rank, then for each step set the flat gradient and synchronize."""
    algo = make_algorithm(name, comm, parameters=AlgorithmParameters(**params), seed=11)
    model = algo.prepare(copy.deepcopy(tiny_model()).to(grads[0][0].dtype))
    plan = algo.plan(model)
    start, flats, memories = comm.bytes, [], []
    timer = PhaseTimer(torch.device("cpu"))
    for step, per_rank in enumerate(grads):
        timer.start_step(step)
        algo.grads.flat.copy_(per_rank[rank])  # type: ignore[attr-defined]
        algo.synchronize(model, timer)
        timer.end_step()
        flats.append(algo.grads.flat.clone())  # type: ignore[attr-defined]
        memories.append(getattr(algo, "memory", torch.zeros(0)).clone())
        algo.zero_grad(model)
    return {"plan": plan, "bytes": comm.bytes - start, "flats": flats, "memories": memories, "algo": algo}


def random_grads(
    steps: int, ranks: int, n: int = 26, seed: int = 0, dtype: torch.dtype = torch.float32
) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(n, generator=g, dtype=dtype) for _ in range(ranks)] for _ in range(steps)]


def test_sign_sgd_three_ranks_apply_the_majority_vote() -> None:
    grads = random_grads(2, 3)
    grads[0][0][:3] = torch.tensor([1.0, 1.0, 1.0])  # first three parameters: 2 to 1, 2 to 1, a tie (one abstains)
    grads[0][1][:3] = torch.tensor([-1.0, 1.0, -1.0])
    grads[0][2][:3] = torch.tensor([-1.0, -1.0, 0.0])
    out = on_ranks(3, lambda r, c: synchronize_steps(r, c, "sign-sgd", grads))
    for step, per_rank in enumerate(grads):
        vote = torch.sign(torch.stack([torch.sign(g) for g in per_rank]).sum(0))
        for rank in range(3):
            assert torch.equal(out[rank]["flats"][step], vote)
    assert out[0]["flats"][0][:3].tolist() == [-1.0, 1.0, 0.0]
    plan = out[0]["plan"]
    assert plan.collectives == ("all-reduce",)
    assert plan.bytes_per_step == 26
    assert plan.uncompressed_bytes_per_step == 26 * 4
    assert plan.record(None).compression_ratio == 4.0
    assert all(o["bytes"] == 2 * plan.bytes_per_step for o in out), "counted bytes differ from the plan"


@pytest.mark.parametrize(("ranks", "density", "k", "dtype"), [(2, 0.15, 4, torch.float32), (3, 0.17, 5, torch.float64)])
def test_sparsified_top_k_averages_every_ranks_largest_entries_and_remembers_the_rest(
    ranks: int, density: float, k: int, dtype: torch.dtype
) -> None:
    n = 26  # k = ceil(density x 26); odd k with fp64 checks the byte packing's alignment
    grads = random_grads(3, ranks, dtype=dtype)
    out = on_ranks(ranks, lambda r, c: synchronize_steps(r, c, "sparsified-sgd", grads, density=density))
    memory = [torch.zeros(n, dtype=dtype) for _ in range(ranks)]
    for step, per_rank in enumerate(grads):
        dense = torch.zeros(n, dtype=dtype)
        for rank in range(ranks):  # the reference: each rank's own top-k of memory + gradient
            acc = memory[rank] + per_rank[rank]
            top = acc.abs().topk(k).indices
            dense[top] += acc[top] / ranks
            memory[rank] = acc.clone()
            memory[rank][top] = 0
            assert torch.equal(out[rank]["memories"][step], memory[rank])
        for rank in range(ranks):
            torch.testing.assert_close(out[rank]["flats"][step], dense, rtol=0, atol=1e-6)
            assert torch.equal(out[rank]["flats"][step], out[0]["flats"][step]), "ranks disagree"
        assert 0 < int((dense != 0).sum()) <= ranks * k
    plan = out[0]["plan"]
    assert plan.collectives == ("all-gather",)
    assert plan.bytes_per_step == k * (dtype.itemsize + 4)
    assert all(o["bytes"] == 3 * plan.bytes_per_step for o in out)


def test_sparsified_random_k_sends_only_values_at_shared_indices() -> None:
    n, ranks = 26, 4
    grads = random_grads(3, ranks, seed=1)
    params = {"density": 0.2, "selection": "random-k"}
    out = on_ranks(ranks, lambda r, c: synchronize_steps(r, c, "sparsified-sgd", grads, **params))
    k = ceil_fraction(n, 0.2)
    memory = [torch.zeros(n) for _ in range(ranks)]
    for step, per_rank in enumerate(grads):
        chosen = (out[0]["flats"][step] != 0).nonzero().flatten()
        assert chosen.numel() == k
        accs = [memory[r] + per_rank[r] for r in range(ranks)]
        expected = torch.zeros(n)
        expected[chosen] = torch.stack([a[chosen] for a in accs]).sum(0) / ranks
        for rank in range(ranks):
            torch.testing.assert_close(out[rank]["flats"][step], expected, rtol=0, atol=1e-6)
            assert torch.equal(out[rank]["flats"][step], out[0]["flats"][step]), "ranks disagree"
            memory[rank] = accs[rank].index_fill(0, chosen, 0)
            assert torch.equal(out[rank]["memories"][step], memory[rank])
    plan = out[0]["plan"]
    assert plan.collectives == ("all-reduce",)
    assert plan.bytes_per_step == k * 4
    assert all(o["bytes"] == 3 * plan.bytes_per_step for o in out)


@pytest.mark.parametrize("name", ["sign-sgd", "sparsified-sgd"])
def test_one_rank_compresses_but_sends_nothing(name: str) -> None:
    grads = random_grads(2, 1, seed=2)
    params = {"density": 0.1} if name == "sparsified-sgd" else {}
    out = synchronize_steps(0, CountingCommunicator(LocalCommunicator("gloo")), name, grads, **params)
    plan = out["plan"]
    assert (plan.collectives, plan.bytes_per_step, out["bytes"]) == ((), 0, 0)
    if name == "sign-sgd":
        assert torch.equal(out["flats"][0], torch.sign(grads[0][0]))
    else:  # k = 3 of 26 move; the other 23 wait in memory and come back in the next step's accumulator
        first = out["flats"][0]
        assert int((first != 0).sum()) == 3
        assert torch.equal(first + out["memories"][0], grads[0][0])
        assert torch.equal(out["flats"][1] + out["memories"][1], out["memories"][0] + grads[1][0])


# -- real multi-process runs --------------------------------------------------------------------------------

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "sign": ("sign-sgd", {}),
    "top-k": ("sparsified-sgd", {"algorithmParameters": {"selection": "top-k"}}),
    "random-k": ("sparsified-sgd", {"algorithmParameters": {"selection": "random-k", "density": 0.05}}),
}


def check_run(out: Path, recs: list[dict[str, Any]], steps: int, case: str) -> RunSummary:
    """Every rank identical after every step, the parameters moved every step, the bytes as declared."""
    for rec in recs:
        assert rec["steps"] == steps
        assert rec["param_sha1"] == recs[0]["param_sha1"], "ranks diverged"
    assert len(set(recs[0]["param_sha1"])) == steps, "a step left the parameters unchanged"
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    comm = summary.communication
    assert comm is not None
    assert comm.measured_bytes_per_step == comm.bytes_per_step > 0
    assert comm.compression_ratio is not None
    assert comm.compression_ratio > 1
    assert comm.collectives == (["all-gather"] if case == "top-k" else ["all-reduce"])
    if case == "sign":
        assert comm.compression_ratio == 4.0  # int8 votes for fp32 gradients
    assert summary.phases.compression > 0
    assert summary.communication_seconds > 0
    return summary


@pytest.mark.multiproc
@pytest.mark.parametrize("case", list(CASES))
def test_resnet_two_ranks_agree_every_step(tmp_path: Path, case: str) -> None:
    name, spec = CASES[case]
    data = write_cifar_python(tmp_path, n_train=48, n_test=20)
    task = resnet_task(data, batch=8, epochs=1, subset=48, warmup=0, milestones=[])
    config = make_config(task, tmp_path / "out", 2, algorithm=name, **spec)
    recs = launch_processes(config, 2, MLBENCH_TRACE_PARAMS="1")
    summary = check_run(tmp_path / "out", recs, 48 // 16, case)
    model = build_model(BenchmarkTaskSpec.model_validate(task).model)
    n = sum(p.numel() for p in model.parameters())  # one int8 vote each, or k = ceil(density n) entries
    k = ceil_fraction(n, config.algorithm_parameters.density or 1.0)
    expected = {"sign": n, "top-k": k * 8, "random-k": k * 4}[case]
    assert summary.communication is not None
    assert summary.communication.bytes_per_step == expected
    assert summary.communication.uncompressed_bytes_per_step == 4 * n


LOGREG: dict[str, Any] = {"batch": 10, "epochs": 5, "train": 400, "test": 200, "features": 20, "alpha": 2.0}


def zero_model_accuracy() -> float:
    """What a model that never moved (zero weights: every output 0, predicted +1) scores on the test split."""
    spec = BenchmarkTaskSpec.model_validate(logreg_task(**LOGREG))
    return float((load_dataset(spec.dataset).y_test > 0).mean())


@pytest.mark.multiproc
@pytest.mark.parametrize("case", list(CASES))
def test_logreg_four_ranks_agree_and_learn(tmp_path: Path, case: str) -> None:
    name, spec = CASES[case]
    config = make_config(logreg_task(**LOGREG), tmp_path / "out", 4, algorithm=name, **spec)
    recs = launch_processes(config, 4, MLBENCH_TRACE_PARAMS="1")
    summary = check_run(tmp_path / "out", recs, int(LOGREG["epochs"]) * 400 // 40, case)
    # Learning: a zero update leaves w = 0, which scores the positive share (0.44) on every evaluation.
    baseline = zero_model_accuracy()
    assert baseline < 0.6
    assert summary.best_accuracy is not None
    assert summary.best_accuracy >= 0.8, (recs[0]["accuracies"], baseline)
    assert recs[0]["accuracies"][-1] >= baseline + 0.2
    weights = np.asarray(recs[0]["param_values"][-1])
    assert (np.abs(weights) > 1e-3).sum() >= 5, "the update should reach many coordinates over 50 steps"


@pytest.mark.multiproc
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed on this machine")
@pytest.mark.parametrize("case", ["sign", "top-k"])
def test_mpi_matches_gloo_bit_for_bit(tmp_path: Path, case: str) -> None:
    """The int8 vote sum and the byte all-gather through mpi4py give exactly gloo's run (fp64)."""
    from .test_mpirun import launch

    name, spec = CASES[case]
    task = logreg_task(batch=5, epochs=2, train=200, features=12, alpha=1.0)
    out = tmp_path / "mpi"
    out.mkdir()
    config = make_config(task, out, 2, algorithm=name, backend="mpi", **spec)
    (out / "config.json").write_text(config.dump())
    proc = launch(out / "config.json", out, 2, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    mpi = read_ranks(out, 2)
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.environment.backend == "mpi"
    assert summary.communication is not None
    assert summary.communication.measured_bytes_per_step == summary.communication.bytes_per_step > 0
    gloo_config = make_config(task, tmp_path / "gloo", 2, algorithm=name, **spec)
    gloo = launch_processes(gloo_config, 2, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64")
    assert mpi[0]["param_sha1"] == mpi[1]["param_sha1"]
    assert len(set(mpi[0]["param_sha1"])) == len(mpi[0]["param_sha1"]) == 2 * 200 // 10
    assert mpi[0]["param_values"] == gloo[0]["param_values"]
