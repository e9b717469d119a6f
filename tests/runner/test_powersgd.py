"""PowerSGD: the arithmetic in-process, agreement with torch's powerSGD_hook, and real gloo/mpi runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mlbench_api.parameters import AlgorithmParameters
from mlbench_runner.algorithms import make_algorithm
from mlbench_runner.algorithms.powersgd import PowerSGD
from mlbench_runner.comm import Communicator, CountingCommunicator, LocalCommunicator
from mlbench_runner.timing import PhaseTimer
from tests.factories import read_summary

from .helpers import env, launch_processes, logreg_task, make_config, read_ranks, resnet_task, write_cifar_python
from .threadcomm import on_ranks

pytestmark = pytest.mark.timeout(300)


# -- in-process helpers ----------------------------------------------------------------------------------------
class MirrorCommunicator(Communicator):
    """``size`` ranks that all hold this rank's tensors: a sum is ``size`` times the tensor.

    Records the phase open at each collective (``timer``) and flags its own kernels (``busy``).
    """

    def __init__(self, size: int = 2, timer: RecordingTimer | None = None) -> None:
        self.rank, self.size, self.name = 0, size, "mirror"
        self.timer = timer
        self.busy = False
        self.calls: list[tuple[str | None, int]] = []

    def all_reduce_sum_(self, tensor: torch.Tensor) -> None:
        self.calls.append((self.timer.current if self.timer else None, tensor.numel()))
        self.busy = True
        tensor.mul_(self.size)
        self.busy = False

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        return None

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        raise AssertionError("powersgd does not all-gather")

    def exchange(self, tensor: torch.Tensor, peers: Sequence[int]) -> list[torch.Tensor]:
        raise AssertionError("powersgd does not exchange")

    def barrier(self) -> None:
        return None


class RecordingTimer(PhaseTimer):
    """A CPU PhaseTimer that also knows which phase is open and the order they were opened in."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.current: str | None = None
        self.opened: list[str] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        assert self.current is None, f"phase {name} opened inside {self.current}"
        self.current = name
        self.opened.append(name)
        try:
            with super().phase(name):
                yield
        finally:
            self.current = None


class OpLog(TorchDispatchMode):
    """Every aten op run while a phase is open: (phase, issued by the communicator, op name)."""

    def __init__(self, timer: RecordingTimer, comm: MirrorCommunicator) -> None:
        super().__init__()
        self.timer, self.comm = timer, comm
        self.ops: list[tuple[str | None, bool, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append((self.timer.current, self.comm.busy, str(func)))
        return func(*args, **(kwargs or {}))


class Small(nn.Module):
    """Matrices of two shapes (one shape twice, not adjacent), a (1, 4) matrix, vectors; no forward needed."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(10, 4)  # (4, 10) + 4
        self.conv = nn.Conv2d(3, 5, 3)  # (5, 3, 3, 3) -> (5, 27) + 5
        self.fc2 = nn.Linear(10, 4)  # (4, 10) again + 4
        self.head = nn.Linear(4, 1)  # (1, 4): r = min(r, 1, 4) = 1 + 1
        self.bn = nn.BatchNorm1d(6)  # 6 + 6


UNCOMPRESSED = 40 + 4 + 135 + 5 + 40 + 4 + 4 + 1 + 12  # every parameter of Small


class Agreement(nn.Module):
    """Matrices that torch's hook compresses at ranks 1 to 3 with min_compression_rate=1: (n + m) r < n m."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 6)  # (6, 12) + 6
        self.conv = nn.Conv2d(3, 5, 3)  # (5, 27) + 5
        self.fc2 = nn.Linear(12, 6)  # (6, 12) + 6
        self.bn = nn.BatchNorm1d(6)  # 6 + 6


def powersgd(comm: Communicator, rank: int = 2, warm_start: bool = True, seed: int = 0) -> PowerSGD:
    algo = make_algorithm("powersgd", comm, parameters=AlgorithmParameters(rank=rank, warm_start=warm_start), seed=seed)
    assert isinstance(algo, PowerSGD)
    return algo


def step(algo: PowerSGD, model: nn.Module, grads: list[torch.Tensor], timer: PhaseTimer | None = None) -> None:
    """Set the gradients and run one synchronize."""
    for p, g in zip(model.parameters(), grads, strict=True):
        assert p.grad is not None
        p.grad.copy_(g)
    timer = timer or PhaseTimer(torch.device("cpu"))
    timer.start_step(0)
    algo.synchronize(model, timer)
    timer.end_step()


def random_grads(model: nn.Module, generator: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in model.parameters()]


# -- the declared bytes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "rank"), [(torch.float32, 2), (torch.float64, 2), (torch.float32, 1)])
def test_declared_bytes_are_r_n_plus_m_and_match_the_count(dtype: torch.dtype, rank: int) -> None:
    # fc1 (4, 10), conv (5, 27), fc2 (4, 10), head (1, 4) at r = min(rank, n, m); vectors 4 + 5 + 4 + 1 + 12 = 26
    numbers = {2: 28 + 64 + 28 + 5 + 26, 1: 14 + 32 + 14 + 5 + 26}[rank]
    model = Small().to(dtype)
    comm = CountingCommunicator(MirrorCommunicator(2))
    algo = powersgd(comm, rank=rank)
    algo.prepare(model)
    comm.collectives.clear()  # prepare broadcast rank 0's model
    plan = algo.plan(model)
    size = torch.finfo(dtype).bits // 8
    assert plan.collectives == ("all-reduce",)
    assert plan.bytes_per_step == numbers * size
    assert plan.uncompressed_bytes_per_step == UNCOMPRESSED * size
    for t in range(3):
        before = comm.bytes
        step(algo, model, random_grads(model, torch.Generator().manual_seed(t)))
        assert comm.bytes - before == plan.bytes_per_step
    assert comm.collectives == {"all-reduce"}


def test_one_rank_sends_nothing_and_keeps_the_exact_gradient() -> None:
    model = Small().double()
    comm = CountingCommunicator(LocalCommunicator("gloo"))
    algo = powersgd(comm)
    algo.prepare(model)
    plan = algo.plan(model)
    assert (plan.collectives, plan.bytes_per_step) == ((), 0)
    assert plan.uncompressed_bytes_per_step == UNCOMPRESSED * 8
    grads = random_grads(model, torch.Generator().manual_seed(1))
    step(algo, model, grads)
    for p, g in zip(model.parameters(), grads, strict=True):
        assert p.grad is not None
        assert torch.equal(p.grad, g)
    assert comm.bytes == 0


# -- the math, with k identical ranks ----------------------------------------------------------------------------
@pytest.mark.parametrize(("warm_start", "true_rank"), [(True, 2), (False, 2), (True, 1), (False, 1)])
def test_gradients_of_rank_at_most_r_come_through_exactly(warm_start: bool, true_rank: int) -> None:
    """Rank 2 compresses a matrix of rank <= 2 losslessly, also a rank-deficient one (P of rank 1)."""
    model = Small().double()
    algo = powersgd(MirrorCommunicator(3), rank=2, warm_start=warm_start)
    algo.prepare(model)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        grads = []
        for p in model.parameters():
            if p.ndim > 1:  # a matrix of rank true_rank (1 for the (1, 4) head)
                n, m = p.shape[0], p[0].numel()
                r = min(true_rank, n, m)
                grads.append(
                    (
                        torch.randn(n, r, generator=gen, dtype=p.dtype)
                        @ torch.randn(r, m, generator=gen, dtype=p.dtype)
                    ).view_as(p)
                )
            else:
                grads.append(torch.randn(p.shape, generator=gen, dtype=p.dtype))
        step(algo, model, grads)
        for p, g in zip(model.parameters(), grads, strict=True):
            torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-12)
        assert algo.error.abs().max() < 1e-12


def test_error_feedback_telescopes_and_updates_have_rank_r() -> None:
    """sum of the applied gradients + the last error == sum of the gradients (every matrix); vectors exact."""
    model = Small().double()
    algo = powersgd(MirrorCommunicator(2), rank=1)
    algo.prepare(model)
    gen = torch.Generator().manual_seed(3)
    applied = [torch.zeros_like(p) for p in model.parameters()]
    given = [torch.zeros_like(p) for p in model.parameters()]
    for _ in range(6):
        grads = random_grads(model, gen)
        step(algo, model, grads)
        for p, g, a, s in zip(model.parameters(), grads, applied, given, strict=True):
            assert p.grad is not None
            if p.ndim > 1:
                assert torch.linalg.matrix_rank(p.grad.reshape(p.shape[0], -1)) == 1
            else:
                torch.testing.assert_close(p.grad, g, rtol=1e-12, atol=1e-14)
            a += p.grad
            s += g
    assert algo.error.abs().max() > 0.1  # the compression is lossy here
    # the error buffer holds the matrices grouped by shape: fc1, fc2 (4, 10), conv (5, 27), head (1, 4)
    params = dict(model.named_parameters())
    order = ["fc1.weight", "fc2.weight", "conv.weight", "head.weight"]
    offset = 0
    index = {name: i for i, name in enumerate(params)}
    for name in order:
        n = params[name].numel()
        error = algo.error[offset : offset + n].view_as(params[name])
        offset += n
        i = index[name]
        torch.testing.assert_close(applied[i] + error, given[i], rtol=1e-10, atol=1e-12)
        assert (applied[i] - given[i]).abs().max() > 1e-3 or name == "head.weight"  # (1, 4) at rank 1 is exact
    assert offset == algo.error.numel()


def test_only_collectives_are_timed_as_communication() -> None:
    model = Small()
    timer = RecordingTimer()
    comm = MirrorCommunicator(2, timer)
    algo = powersgd(comm)
    algo.prepare(model)
    grads = random_grads(model, torch.Generator().manual_seed(4))
    for p, g in zip(model.parameters(), grads, strict=True):
        assert p.grad is not None
        p.grad.copy_(g)
    timer.start_step(0)
    with OpLog(timer, comm) as log:
        algo.synchronize(model, timer)
    timer.end_step()
    steps = timer.flush()
    assert timer.opened == ["compression", "communication", "compression", "communication", "compression"]
    # vectors and P in the first communication block, Q in the second; each one flat buffer
    assert comm.calls == [
        ("communication", 26),
        ("communication", 2 * 4 + 2 * 4 + 2 * 5 + 1),
        ("communication", 2 * 10 + 2 * 10 + 2 * 27 + 4),
    ]
    assert all(phase is not None for phase, _, _ in log.ops), "a kernel ran outside the timed phases"
    in_communication = [op for phase, busy, op in log.ops if phase == "communication" and not busy]
    assert in_communication == [], f"kernels timed as communication: {in_communication}"
    assert sum(1 for phase, _, _ in log.ops if phase == "compression") > 10
    assert steps[0].phases["compression"] > 0
    assert steps[0].phases["communication"] > 0


def test_warm_start_survives_a_zero_gradient() -> None:
    """A matrix whose gradient is zero on every rank gives Q = 0; the next steps must still compress it."""
    model = Small().double()
    algo = powersgd(MirrorCommunicator(2), rank=2, warm_start=True)
    algo.prepare(model)
    gen = torch.Generator().manual_seed(5)
    zero = [torch.zeros_like(p) for p in model.parameters()]
    step(algo, model, zero)
    assert all(torch.isfinite(p.grad).all() and not p.grad.any() for p in model.parameters() if p.grad is not None)
    low_rank = [
        (
            torch.randn(p.shape[0], 1, generator=gen, dtype=p.dtype)
            @ torch.randn(1, p[0].numel(), generator=gen, dtype=p.dtype)
        ).view_as(p)
        if p.ndim > 1
        else torch.randn(p.shape, generator=gen, dtype=p.dtype)
        for p in model.parameters()
    ]
    step(algo, model, low_rank)
    for p, g in zip(model.parameters(), low_rank, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-12)


# -- agreement with torch's powerSGD_hook, 2 gloo processes ------------------------------------------------------
#: (matrix approximation rank, warm start, dtype) of each comparison, all in one pair of processes.
AGREEMENT_CASES = [
    (2, True, "float64"),
    (2, False, "float64"),
    (1, True, "float64"),
    (3, True, "float64"),
    (2, True, "float32"),
]
AGREEMENT_STEPS = 4
SEED = 11


class FakeBucket:
    """What powerSGD_hook reads of a dist.GradBucket: one flat buffer, its per-parameter views, index 0, last."""

    def __init__(self, grads: list[torch.Tensor]) -> None:
        self._buffer = torch.cat([g.reshape(-1) for g in grads])
        self._views: list[torch.Tensor] = []
        offset = 0
        for g in grads:
            self._views.append(self._buffer[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


class KeepingDict(dict[int, torch.Tensor]):
    """A dict that remembers what it held before its last ``clear()``."""

    last: dict[int, torch.Tensor] = {}

    def clear(self) -> None:
        self.last = dict(self)
        super().clear()

    def latest(self) -> torch.Tensor:
        """Bucket 0's tensor, now or before the last clear."""
        return self[0] if 0 in self else self.last[0]


def agreement_worker(rank: int, world: int, port: int, out: Path) -> None:
    """One rank: per case and step, the same per-rank gradients through our PowerSGD and through torch's hook."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

    from mlbench_runner.comm import TorchCommunicator
    from mlbench_runner.world import World

    torch.set_num_threads(1)
    comm = TorchCommunicator(World(rank, world, rank, world, "127.0.0.1", port, "env"), "gloo")
    results: list[dict[str, list[torch.Tensor]]] = []
    for case, (r, warm_start, dtype_name) in enumerate(AGREEMENT_CASES):
        dtype = getattr(torch, dtype_name)
        model = Agreement().to(dtype)
        ours = powersgd(comm, rank=r, warm_start=warm_start, seed=SEED)
        ours.prepare(model)
        # min_compression_rate=1 compresses every matrix here ((n+m)r < nm for each) but not the vectors, which a
        # rate of 0 would compress as (n, 1) matrices; start_powerSGD_iter must be >= 2 with error feedback or
        # warm start, so the state starts at that iteration (no vanilla all-reduce steps).
        state = PowerSGDState(
            process_group=None,
            matrix_approximation_rank=r,
            start_powerSGD_iter=2,
            min_compression_rate=1,
            use_error_feedback=True,
            warm_start=warm_start,
            random_seed=SEED,
        )
        state.iter = 2
        # without warm start the hook clears its P and Q memories at the end of each step: keep the last ones
        p_memory, q_memory = KeepingDict(), KeepingDict()
        state.p_memory_dict, state.q_memory_dict = p_memory, q_memory
        record: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("ours", "torch", "p", "tp", "q", "tq", "e", "te", "exact")
        }
        for t in range(AGREEMENT_STEPS):
            gen = torch.Generator().manual_seed(1000 * case + 10 * t + rank)
            grads = [torch.randn(p.shape, generator=gen, dtype=dtype) for p in model.parameters()]
            step(ours, model, grads)
            bucket = FakeBucket(grads)
            fut = powerSGD_hook(state, bucket)  # type: ignore[arg-type]
            fut.wait()
            exact = torch.cat([g.reshape(-1) for g in grads])
            comm.all_reduce_sum_(exact)
            record["exact"].append(exact / world)
            record["ours"].append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]))
            record["torch"].append(bucket.buffer().clone())
            record["p"].append(ours.p.clone())
            record["tp"].append(p_memory.latest().clone())
            record["q"].append(ours.q.clone())
            record["tq"].append(q_memory.latest().clone())
            # the error memory of the matrices: ours grouped by shape, torch's in bucket (parameter) order
            offsets, offset = {}, 0
            for name, p in model.named_parameters():
                offsets[name] = (offset, p.numel())
                offset += p.numel()
            order = ["fc1.weight", "fc2.weight", "conv.weight"]
            record["e"].append(ours.error.clone())
            record["te"].append(torch.cat([state.error_dict[0][o : o + n] for o, n in (offsets[k] for k in order)]))
        results.append(record)
    torch.save(results, out / f"rank-{rank}.pt")
    comm.close()


def labelled(where: str, key: str) -> Callable[[str], str]:
    return lambda message: f"{where} {key}: {message}"


@pytest.mark.multiproc
def test_agrees_with_torch_powersgd_hook(tmp_path: Path) -> None:
    from mlbench_runner.world import free_port

    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.runner.test_powersgd", str(r), "2", port, str(tmp_path)],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    ranks = [torch.load(tmp_path / f"rank-{r}.pt") for r in range(2)]
    for case, (r, warm_start, dtype_name) in enumerate(AGREEMENT_CASES):
        tol = 1e-12 if dtype_name == "float64" else 1e-5  # relative and absolute
        for rank in range(2):
            rec = ranks[rank][case]
            for t in range(AGREEMENT_STEPS):
                where = f"case {(r, warm_start, dtype_name)} rank {rank} step {t}"
                for ours, theirs in (("ours", "torch"), ("p", "tp"), ("q", "tq"), ("e", "te")):
                    torch.testing.assert_close(
                        rec[ours][t], rec[theirs][t], rtol=tol, atol=tol, msg=labelled(where, ours)
                    )
                # identical on both ranks, and really compressed: not the exact mean
                assert torch.equal(rec["ours"][t], ranks[0][case]["ours"][t]), where
                assert (rec["ours"][t] - rec["exact"][t]).abs().max() > 1e-2, where
                if t:
                    assert rec["e"][t].abs().max() > 1e-2, where


# -- real runs -------------------------------------------------------------------------------------------------
def resnet20_bytes(rank: int) -> int:
    """ResNet-20 m1 at fp32, by hand: conv1 (16, 27); 6 x (16, 144); (32, 144), 5 x (32, 288); (64, 288),
    5 x (64, 576); fc (10, 64); 1386 BatchNorm and bias numbers uncompressed."""
    shapes = [(16, 27)] + [(16, 144)] * 6 + [(32, 144)] + [(32, 288)] * 5 + [(64, 288)] + [(64, 576)] * 5 + [(10, 64)]
    return 4 * (sum(min(rank, n, m) * (n + m) for n, m in shapes) + 1386)


def test_resnet20_declared_bytes() -> None:
    from mlbench_api.model import ModelSpec
    from mlbench_runner.rank.models import build_model

    model = build_model(ModelSpec.model_validate({"name": "resnet", "version": "m1", "depth": 20}))
    algo = powersgd(MirrorCommunicator(2), rank=2)
    plan = algo.plan(model)
    assert plan.bytes_per_step == resnet20_bytes(2) == 56_784
    assert plan.uncompressed_bytes_per_step == 4 * 269_722
    assert 18.9 < plan.uncompressed_bytes_per_step / plan.bytes_per_step < 19.1


@pytest.mark.multiproc
@pytest.mark.parametrize(("ranks", "epochs"), [(2, 2), (4, 1)])
def test_resnet_ranks_identical_and_bytes_as_declared(tmp_path: Path, ranks: int, epochs: int) -> None:
    data = write_cifar_python(tmp_path, n_train=80, n_test=20)
    task = resnet_task(data, batch=8, epochs=epochs, subset=64, warmup=0, milestones=[])
    config = make_config(task, tmp_path / "out", ranks, algorithm="powersgd", algorithmParameters={"rank": 2})
    recs = launch_processes(config, ranks, MLBENCH_TRACE_PARAMS="1")
    steps = epochs * (64 // (8 * ranks))
    for rec in recs:
        assert rec["steps"] == steps
        assert rec["param_sha1"] == recs[0]["param_sha1"], "ranks diverged"
        assert len(rec["buffer_sha1"]) == epochs
        assert rec["buffer_sha1"] == recs[0]["buffer_sha1"], "ranks evaluated different BatchNorm statistics"
    assert len(set(recs[0]["param_sha1"])) == steps  # the parameters changed every step
    summary = read_summary(tmp_path / "out")
    comm = summary.communication
    assert comm is not None
    assert comm.collectives == ["all-reduce"]
    assert comm.bytes_per_step == resnet20_bytes(2)
    assert comm.measured_bytes_per_step == comm.bytes_per_step
    assert comm.uncompressed_bytes_per_step == 4 * 269_722
    assert comm.compression_ratio is not None
    assert comm.compression_ratio > 1
    assert summary.phases.compression > 0
    assert summary.phases.communication > 0


@pytest.mark.multiproc
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed on this machine")
def test_mpirun_matches_gloo(tmp_path: Path) -> None:
    """backend mpi (mpi4py all-reduce) under mpirun: the same trajectory as gloo, bit for bit (2 ranks)."""
    from mlbench_runner.pod.launch import launcher_command
    from mlbench_runner.world import free_port

    data = write_cifar_python(tmp_path, n_train=40, n_test=20)
    task = resnet_task(data, batch=8, epochs=1, subset=32, warmup=0, milestones=[])
    out = tmp_path / "mpi"
    out.mkdir()
    config = make_config(task, out, 2, backend="mpi", algorithm="powersgd", algorithmParameters={"rank": 1})
    (out / "config.json").write_text(config.dump())
    (out / "hostfile").write_text("localhost slots=2\n")
    proc = subprocess.run(
        launcher_command(out / "config.json", out / "hostfile", out / "termination-log", oversubscribe=True),
        env=env(MASTER_PORT=str(free_port()), MLBENCH_TRACE_PARAMS="1"),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    mpi = read_ranks(out, 2)
    gloo_config = make_config(task, tmp_path / "gloo", 2, algorithm="powersgd", algorithmParameters={"rank": 1})
    gloo = launch_processes(gloo_config, 2, MLBENCH_TRACE_PARAMS="1")
    assert mpi[0]["steps"] == 2
    assert mpi[0]["param_sha1"] == mpi[1]["param_sha1"] == gloo[0]["param_sha1"]
    summary = read_summary(out)
    assert summary.environment.backend == "mpi"
    assert summary.communication is not None
    assert summary.communication.bytes_per_step == resnet20_bytes(1)
    assert summary.communication.measured_bytes_per_step == resnet20_bytes(1)


@pytest.mark.multiproc
def test_logreg_is_compressed_exactly_and_learns(tmp_path: Path) -> None:
    """Logistic regression's weight is (1, d): at any rank PowerSGD sends P (1 x 1) and Q (d x 1) and the
    approximation is exact, so its trajectory is allreduce-sgd's (fp64, to rounding); and it learns."""
    task = logreg_task(batch=10, epochs=3, train=400, features=20, alpha=2.0)
    psgd_config = make_config(task, tmp_path / "p", 2, algorithm="powersgd", algorithmParameters={"rank": 2})
    psgd = launch_processes(psgd_config, 2, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64")
    ref = launch_processes(make_config(task, tmp_path / "a", 2), 2, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64")
    assert psgd[0]["param_sha1"] == psgd[1]["param_sha1"]
    a, b = np.asarray(psgd[0]["param_values"]), np.asarray(ref[0]["param_values"])
    assert a.shape == b.shape == (3 * 400 // 20, 20)
    assert np.abs(a).max() > 0.1
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert psgd[0]["accuracies"][-1] > 0.8  # chance is 0.5
    summary = read_summary(tmp_path / "p")
    assert summary.communication is not None
    assert summary.communication.bytes_per_step == 8 * (1 + 20)  # worse than sending w (ratio 20/21): as the paper


def gaussian_classes(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """10 Gaussian classes in 40 dimensions (means fixed, samples from ``seed``)."""
    means = torch.randn(10, 40, generator=torch.Generator().manual_seed(0)) * 0.6
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=gen)
    return means[y] + torch.randn(n, 40, generator=gen), y


def train_softmax(algorithm: str, ranks: int = 2, steps: int = 50, batch: int = 16) -> tuple[list[float], float]:
    """Softmax regression (a 10 x 40 weight: rank 1 sends 50 of 400 numbers) on ``ranks`` threads, each its own
    data; returns each rank's test accuracy and the largest relative distance of an applied gradient from the
    exact mean gradient."""
    x_test, y_test = gaussian_classes(99, 1000)

    def rank_main(rank: int, comm: Communicator) -> tuple[float, float]:
        model = nn.Linear(40, 10)
        nn.init.zeros_(model.weight)
        nn.init.zeros_(model.bias)
        name = "powersgd" if algorithm.startswith("powersgd") else algorithm
        params = AlgorithmParameters(rank=1) if name == "powersgd" else None
        algo = make_algorithm(name, comm, parameters=params, seed=3)
        algo.prepare(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
        x, y = gaussian_classes(rank + 1, steps * batch)
        timer = PhaseTimer(torch.device("cpu"))
        distance = 0.0
        for s in range(steps):
            nn.functional.cross_entropy(
                model(x[s * batch : (s + 1) * batch]), y[s * batch : (s + 1) * batch]
            ).backward()
            exact = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
            comm.all_reduce_sum_(exact)
            exact /= ranks
            timer.start_step(s)
            algo.synchronize(model, timer)
            timer.end_step()
            applied = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
            if algorithm == "powersgd-zeros":  # the negative control: an algorithm that returns zeros
                applied.zero_()
                for p in model.parameters():
                    assert p.grad is not None
                    p.grad.zero_()
            distance = max(distance, float((applied - exact).norm() / exact.norm()))
            optimizer.step()
            algo.zero_grad(model)
        with torch.no_grad():
            return float((model(x_test).argmax(1) == y_test).float().mean()), distance

    per_rank = on_ranks(ranks, rank_main)
    return [accuracy for accuracy, _ in per_rank], max(distance for _, distance in per_rank)


def test_lossy_rank_1_still_learns() -> None:
    """Rank 1 on a 10 x 40 softmax-regression weight is lossy (the applied gradient is far from the exact
    mean); with error feedback it learns about as well as allreduce-sgd, and far above chance (0.1), which an
    algorithm that returns zeros does not reach."""
    psgd, distance = train_softmax("powersgd")
    reference, exact = train_softmax("allreduce-sgd")
    zeros, _ = train_softmax("powersgd-zeros")
    assert psgd[0] == psgd[1]  # one model on both ranks
    assert exact < 1e-6  # the harness measures the distance right ...
    assert distance > 0.3  # ... and PowerSGD's updates were really compressed
    assert reference[0] > 0.9
    assert psgd[0] > 0.85
    assert psgd[0] > reference[0] - 0.05
    assert zeros[0] < 0.3  # the assertions above catch an algorithm that stopped learning


if __name__ == "__main__":  # a rank of test_agrees_with_torch_powersgd_hook
    agreement_worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
