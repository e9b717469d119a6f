"""Task 0a, the collectives benchmark: nccl-tests' formulas, the size ladder, the API rules, and real sweeps
(gloo at 2 and 4 ranks, mpi under mpirun) whose result files must be complete and self-consistent.

No assertion here is about speed: the figures this machine reaches are in benchmarks/collectives_cpu.py.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from mlbench_api import BenchmarkRun, BenchmarkTaskSpec, RunConfig
from mlbench_api.collectives import CollectiveBenchmark, CollectiveOp, size_ladder
from mlbench_api.config import AlgorithmNotAllowed, OverrideNotAllowed, effective_config
from mlbench_api.errors import format_errors
from mlbench_api.results import CollectiveMeasurement, CollectiveResult, Environment, PhaseTotals, RunSummary
from mlbench_runner.pod.launch import launcher_command
from mlbench_runner.rank import collectives as coll
from mlbench_runner.tools import collective_table
from mlbench_runner.world import World, free_port
from tests.factories import collectives_summary

from .helpers import env, logreg_task, make_config, run_doc

RUNNER = {"image": "mlbench/runner:test", "command": ["mlbench-runner", "collectives"]}
#: A sweep small enough for two CPU cores: 4 B .. 1 MiB, x4 per step (10 sizes), 3 timed iterations.
SMALL = {"minBytes": 4, "maxBytes": 1 << 20, "factor": 4, "iterations": 3, "warmupIterations": 2}


def collectives_task(**sweep: Any) -> dict[str, Any]:
    return {"division": "open", "collectives": {**SMALL, **sweep}, "runner": RUNNER}


def problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as info:
        BenchmarkTaskSpec.model_validate(data)
    return format_errors(info.value)


# -- nccl-tests' definitions ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all-reduce", 1, 0.0),
        ("all-reduce", 2, 1.0),
        ("all-reduce", 4, 1.5),
        ("all-reduce", 8, 1.75),
        ("all-gather", 1, 0.0),
        ("all-gather", 2, 0.5),
        ("all-gather", 4, 0.75),
        ("all-gather", 8, 0.875),
        ("broadcast", 1, 0.0),  # nccl-tests says 1: a one-rank no-op's "bandwidth" would be the peak
        ("broadcast", 2, 1.0),
        ("broadcast", 16, 1.0),
    ],
)
def test_bus_factor_is_nccl_tests(op: str, n: int, factor: float) -> None:
    assert coll.bus_factor(op, n) == pytest.approx(factor)


def test_bandwidths_from_size_and_time() -> None:
    mib = 1 << 20
    assert coll.algorithm_bandwidth(mib, 0.001) == pytest.approx(mib * 1000)
    assert coll.bus_bandwidth("all-reduce", mib, 0.001, 4) == pytest.approx(mib * 1000 * 1.5)
    assert coll.bus_bandwidth("all-gather", mib, 0.002, 4) == pytest.approx(mib * 500 * 0.75)
    assert coll.bus_bandwidth("broadcast", mib, 0.004, 4) == pytest.approx(mib * 250)
    with pytest.raises(ValueError, match="positive"):
        coll.algorithm_bandwidth(mib, 0.0)
    with pytest.raises(ValueError, match="at least 1"):
        coll.bus_factor("all-reduce", 0)
    with pytest.raises(ValueError, match="is not a valid CollectiveOp"):
        coll.bus_factor("reduce-scatter", 2)


def test_a_row_is_consistent() -> None:
    size = coll.Size(CollectiveOp.ALL_REDUCE, 4096, 1024)
    row = coll.measurement(size, 4, 5, 0.002, [0.003, 0.001, 0.002, 0.010, 0.002])
    assert row.algorithm_bandwidth == pytest.approx(4096 / 0.002)
    assert row.bus_bandwidth == pytest.approx(row.algorithm_bandwidth * 1.5)
    assert row.bus_factor == 1.5
    assert row.latency_min_seconds == 0.001
    assert row.latency_max_seconds == 0.010
    assert row.latency_p50_seconds == pytest.approx(0.002)
    assert row.latency_p50_seconds <= row.latency_p90_seconds <= row.latency_p99_seconds <= row.latency_max_seconds
    assert row.latency_mean_seconds == pytest.approx(0.0036)


def test_percentile_interpolates_and_is_monotone() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert coll.percentile(values, 0.5) == 3.0
    assert coll.percentile(values, 0.9) == pytest.approx(4.6)
    assert coll.percentile([7.0], 0.99) == 7.0
    qs = [coll.percentile(values, q / 100) for q in range(101)]
    assert qs == sorted(qs)
    with pytest.raises(ValueError, match="no values"):
        coll.percentile([], 0.5)


# -- the size ladder -----------------------------------------------------------------------------------------------
def test_default_ladder_is_4_bytes_to_256_mib_doubling() -> None:
    sizes = CollectiveBenchmark().sizes()
    assert sizes[0] == 4
    assert sizes[-1] == 256 * 1024 * 1024
    assert len(sizes) == 27
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))


@pytest.mark.parametrize(
    ("low", "high", "factor", "expected"),
    [
        (4, 4, 2, [4]),
        (4, 64, 4, [4, 16, 64]),
        (4, 100, 4, [4, 16, 64, 100]),  # the endpoint is timed even off the ladder
        (1024, 1000000, 10, [1024, 10240, 102400, 1000000]),
        (8, 16, 1024, [8, 16]),
    ],
)
def test_ladder_includes_both_endpoints(low: int, high: int, factor: int, expected: list[int]) -> None:
    sizes = size_ladder(low, high, factor)
    assert sizes == expected
    assert sizes == sorted(set(sizes))


def test_ladder_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="size ladder"):
        size_ladder(8, 4, 2)
    with pytest.raises(ValueError, match="size ladder"):
        size_ladder(4, 8, 1)


def test_all_gather_sizes_are_the_gathered_total() -> None:
    spec = CollectiveBenchmark.model_validate(SMALL)
    by_op = {op: [s for s in coll.plan(spec, 4) if s.op is op] for op in CollectiveOp}
    assert [s.nbytes for s in by_op[CollectiveOp.ALL_REDUCE]] == spec.sizes()
    assert [s.nbytes for s in by_op[CollectiveOp.BROADCAST]] == spec.sizes()
    gathered = by_op[CollectiveOp.ALL_GATHER]
    assert [s.nbytes for s in gathered] == spec.sizes()[1:]  # 4 B is one float: it cannot split over 4 ranks
    assert all(s.elements * 4 * 4 == s.nbytes for s in gathered)  # each rank contributes S / n
    # three ranks: rounded down to a multiple of 3 floats, never repeated
    three = [s for s in coll.plan(CollectiveBenchmark(min_bytes=4, max_bytes=1 << 20), 3) if s.op.value == "all-gather"]
    assert [s.nbytes for s in three][:3] == [12, 24, 60]  # 16, 32 and 64 B: 1, 2 and 5 floats a rank
    assert three[-1].nbytes == (262144 // 3) * 3 * 4
    assert len({s.nbytes for s in three}) == len(three)


def test_timed_iterations_follow_the_budget() -> None:
    spec = CollectiveBenchmark(iterations=20, max_seconds_per_size=10)
    assert coll.timed_iterations(spec, 0.0) == 20  # nothing measured: as asked
    assert coll.timed_iterations(spec, 0.001) == 20
    assert coll.timed_iterations(spec, 1.0) == 5  # two loops of 5 x 1 s fit in 10 s
    assert coll.timed_iterations(spec, 100.0) == 1  # never fewer than one


@pytest.mark.parametrize(
    ("checked", "warm_seconds", "warm", "estimate", "k"),
    [
        (2.0, 4.0, 4, 1.0, 5),  # the mean of the unchecked warm-up iterations
        (9.0, 0.004, 4, 0.001, 20),  # a slow first (checked) iteration does not count when others ran
        (1.0, 0.0, 0, 1.0, 5),  # warmupIterations: 1: the checked iteration is the estimate, the budget holds
        (100.0, 0.0, 0, 100.0, 1),
        (0.0, 0.0, 0, 0.0, 20),  # nothing measurable: as asked
    ],
)
def test_the_warm_up_estimate_sizes_the_loops(
    checked: float, warm_seconds: float, warm: int, estimate: float, k: int
) -> None:
    spec = CollectiveBenchmark(iterations=20, max_seconds_per_size=10)
    assert coll.warmup_estimate(checked, warm_seconds, warm) == pytest.approx(estimate)
    assert coll.timed_iterations(spec, coll.warmup_estimate(checked, warm_seconds, warm)) == k


@pytest.mark.multiproc
def test_one_warm_up_iteration_still_keeps_the_time_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With warmupIterations: 1 the checked iteration sizes the loops: a tiny maxSecondsPerSize means one iteration."""
    from mlbench_runner.metrics import CollectiveMetrics

    monkeypatch.setattr(CollectiveMetrics, "serve", lambda self, port: None)
    monkeypatch.setenv("MLBENCH_THREADS", "1")
    task = collectives_task(
        operations=["all-reduce"], maxBytes=64, iterations=50, warmupIterations=1, maxSecondsPerSize=1e-9
    )
    summary = coll.run_collectives(make_config(task, tmp_path, 1), World(0, 1, 0, 1, "127.0.0.1", 0, "single"))
    assert summary is not None
    assert summary.collectives is not None
    assert [r.iterations for r in summary.collectives.rows] == [1, 1, 1]


class OnePeerComm:
    """Rank ``rank`` of two, the peer simulated: its broadcast may deliver wrong data here, and the peer may
    report that its own check failed (the first all-gather after a check is the ranks' vote)."""

    size = 2

    def __init__(self, rank: int, *, broken_broadcast: bool = False, peer_failed: bool = False) -> None:
        self.rank, self.broken_broadcast, self.peer_failed = rank, broken_broadcast, peer_failed
        self.gathers = 0

    def all_reduce_sum_(self, tensor: Any) -> None:
        tensor.mul_(2)  # the peer holds the same value: a mean over ranks is this rank's

    def broadcast_(self, tensor: Any, src: int = 0) -> None:
        if not self.broken_broadcast:
            tensor.fill_(1.0)  # rank 0's fill

    def all_gather(self, tensor: Any) -> Any:
        import torch

        self.gathers += 1
        peer = torch.full_like(tensor, 1.0 if self.peer_failed else 0.0) if self.gathers == 1 else tensor
        return torch.stack([tensor, peer] if self.rank == 0 else [peer, tensor])

    def barrier(self) -> None:
        pass


@pytest.mark.parametrize(
    ("comm", "raised"),
    [
        (OnePeerComm(1), None),
        (OnePeerComm(1, broken_broadcast=True), "returned wrong data (expected every element 1"),  # it sees it
        (OnePeerComm(0, peer_failed=True), "returned wrong data on another rank"),  # the root cannot see it
    ],
    ids=["agreed", "wrong-here", "wrong-on-the-peer"],
)
def test_every_rank_stops_when_any_rank_got_wrong_data(comm: OnePeerComm, raised: str | None) -> None:
    """A broadcast receiver that got wrong data must not stop alone (its root, which sent its own data, would
    wait in the next collective): the ranks vote after every check, and all raise."""
    import torch

    spec = CollectiveBenchmark.model_validate({**SMALL, "operations": ["broadcast"], "maxBytes": 16})
    sweep = coll.Sweep(spec, comm, torch.device("cpu"))  # type: ignore[arg-type]
    if raised is None:
        assert len(sweep.run()) == len(coll.plan(spec, 2))
    else:
        with pytest.raises(coll.CollectiveError, match=re.escape(raised)):
            sweep.run()
        assert comm.gathers == 1  # the vote was taken before raising


# -- the API -------------------------------------------------------------------------------------------------------
def test_a_collectives_task_has_no_training_sections() -> None:
    spec = BenchmarkTaskSpec.model_validate(collectives_task())
    assert not spec.has_training
    assert spec.collectives is not None
    assert spec.collectives.operations == list(CollectiveOp)
    for name in ("model", "dataset", "training", "goal"):
        with pytest.raises(ValueError, match=rf"^{name}: this is a collectives task"):
            getattr(spec, name)
    wire = spec.to_api()
    assert not {"model", "dataset", "training", "goal"} & set(wire)
    assert BenchmarkTaskSpec.model_validate(wire) == spec


def test_a_training_task_reads_as_before() -> None:
    spec = BenchmarkTaskSpec.model_validate(logreg_task())
    assert spec.has_training
    assert spec.collectives is None
    assert spec.training.batch_size_per_worker == 10
    assert set(spec.to_api()) >= {"model", "dataset", "training", "goal"}
    # model_copy takes the wire names too (the properties would otherwise hide the copied value)
    copy = spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"name": "other"})})
    assert copy.dataset.name == "other"
    assert spec.dataset.name == "epsilon-synthetic"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": {"name": "logistic-regression"}}, "collectives: a collectives task has no model"),
        ({"overridable": ["maxEpochs"]}, "overridable: a collectives task"),
        ({"collectives": {"minBytes": 4096, "maxBytes": 1024}}, "collectives.minBytes: must not exceed maxBytes"),
        ({"collectives": {"maxBytes": 1000001}}, "collectives.maxBytes: Input should be a multiple of 4"),
        ({"collectives": {"maxBytes": 2 << 30}}, "collectives.maxBytes: Input should be less than or equal to"),
        ({"collectives": {"minBytes": 0}}, "collectives.minBytes: Input should be greater than or equal to 4"),
        ({"collectives": {"factor": 1}}, "collectives.factor"),
        ({"collectives": {"operations": ["broadcast", "broadcast"]}}, "collectives.operations: must not repeat"),
        ({"collectives": {"operations": ["reduce"]}}, "collectives.operations.0"),
        ({"collectives": {"dtype": "float16"}}, "collectives.dtype"),
    ],
)
def test_invalid_collectives_tasks_name_the_field(change: dict[str, Any], field: str) -> None:
    data = collectives_task()
    data.update(change)
    assert any(p.startswith(field) for p in problems(data)), problems(data)


def test_a_task_needs_training_sections_or_collectives() -> None:
    data = logreg_task()
    del data["goal"]
    assert problems(data) == ["goal: goal is required (unless the task sets collectives)"]


def _run(**spec: Any) -> BenchmarkRun:
    return BenchmarkRun.model_validate(run_doc("sweep", "task-0a", 2, **spec))


def test_the_effective_config_of_a_collectives_run_has_no_goal_or_schedule(tmp_path: Path) -> None:
    task = BenchmarkTaskSpec.model_validate(collectives_task())
    config = effective_config(_run(backend="mpi"), "task-0a", task, output_dir=str(tmp_path))
    wire = config.to_api()
    assert "goalTarget" not in wire
    assert "lr" not in wire
    assert "timeBudgetSeconds" not in wire
    with pytest.raises(ValueError, match=r"^goalTarget: "):
        _ = config.goal_target
    with pytest.raises(ValueError, match=r"^lr: "):
        _ = config.lr
    (tmp_path / "c.json").write_text(config.dump())
    assert RunConfig.load(tmp_path / "c.json") == config
    # a training run's config still carries both, under the same wire names
    training = make_config(logreg_task(), tmp_path, 2)
    assert training.goal_target == 0.999
    assert training.to_api()["lr"]["alpha"] == 2.0


def test_a_collectives_run_takes_no_overrides_and_no_algorithm() -> None:
    task = BenchmarkTaskSpec.model_validate(collectives_task())
    with pytest.raises(OverrideNotAllowed, match=r"^spec\.overrides: maxEpochs cannot be overridden"):
        effective_config(_run(overrides={"maxEpochs": 2}), "task-0a", task)
    with pytest.raises(AlgorithmNotAllowed, match=r"^spec\.algorithm: powersgd means nothing"):
        effective_config(_run(algorithm="powersgd"), "task-0a", task)


def test_the_termination_message_carries_the_peaks_not_the_table() -> None:
    rows = [
        coll.measurement(s, 4, 20, 1e-4 * (i + 1), [1e-4 * (i + 1)] * 20)
        for i, s in enumerate(coll.plan(CollectiveBenchmark(), 4))
    ]
    result = CollectiveResult(backend="gloo", world_size=4, device="cpu", warmup_iterations=5, rows=rows)
    summary = collectives_summary(
        result,
        run="r",
        task="backend-collectives",
        steps=0,
        wall_clock_seconds=1.0,
        train_seconds=1.0,
        communication_seconds=1.0,
        phases=PhaseTotals(),
        environment=Environment(world_size=4, backend="gloo", devices=["cpu " + "x" * 200]),
    )
    assert len(rows) == 27 * 3 - 2  # all-gather of 4 and 8 B cannot split over 4 ranks
    message = summary.termination_message()
    assert len(message.encode()) < 4096
    back = RunSummary.from_termination_message(message)
    assert back.collectives is None
    assert back.peak_bus_bandwidth == pytest.approx(
        {op.value: max(r.bus_bandwidth for r in rows if r.op == op.value) for op in CollectiveOp}
    )


# -- real sweeps ---------------------------------------------------------------------------------------------------
def write_config(tmp: Path, ranks: int, **spec: Any) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    config = make_config(collectives_task(), tmp, ranks, name="sweep", **spec)
    (tmp / "config.json").write_text(config.dump())
    return tmp / "config.json"


def launch_ranks(config: Path, ranks: int, subcommand: str = "collectives", timeout: float = 240) -> list[str]:
    """``ranks`` processes of ``mlbench-runner <subcommand>`` with torch-style env; their outputs."""
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "mlbench_runner.cli", subcommand, "--config", str(config)],
            env=env(RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(ranks)
    ]
    outputs = []
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    assert not failed, f"rank(s) {failed} failed:\n{outputs[failed[0]][-3000:]}"
    return outputs


def check_sweep(out: Path, ranks: int, backend: str) -> CollectiveResult:
    """The result files are complete and self-consistent (no figure is judged)."""
    result = CollectiveResult.model_validate_json((out / "collectives.json").read_text())
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.status == "success"
    assert summary.stop_reason == "completed"
    assert summary.goal_reached
    assert summary.goal_target is None
    assert summary.best_accuracy is None
    assert summary.collectives == result
    assert summary.environment.world_size == ranks
    assert summary.environment.backend == backend
    assert result.world_size == ranks
    assert result.backend == backend
    spec = CollectiveBenchmark.model_validate(SMALL)
    planned = [(s.op.value, s.nbytes) for s in coll.plan(spec, ranks)]
    assert [(r.op, r.bytes) for r in result.rows] == planned  # every op x size, in order
    assert {op for op, _ in planned} == {"all-reduce", "all-gather", "broadcast"}
    for r in result.rows:
        assert r.iterations == 3
        assert r.time_seconds > 0
        assert r.algorithm_bandwidth > 0
        assert r.algorithm_bandwidth == pytest.approx(r.bytes / r.time_seconds)
        assert r.bus_factor == pytest.approx(coll.bus_factor(r.op, ranks))
        assert r.bus_bandwidth == pytest.approx(r.algorithm_bandwidth * r.bus_factor)
        assert 0 < r.latency_min_seconds <= r.latency_p50_seconds <= r.latency_p90_seconds
        assert r.latency_p90_seconds <= r.latency_p99_seconds <= r.latency_max_seconds
        assert r.latency_min_seconds <= r.latency_mean_seconds <= r.latency_max_seconds
        assert r.elements * 4 * (ranks if r.op == "all-gather" else 1) == r.bytes
    assert summary.peak_bus_bandwidth == result.peak_bus_bandwidth()
    assert summary.steps == 2 * 3 * len(planned)  # two timed loops of 3 iterations per row
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("collective") == len(planned)
    assert events[-1]["event"] == "run_summary"
    return result


@pytest.mark.multiproc
@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2, 4])
def test_gloo_sweep_writes_a_complete_result(tmp_path: Path, ranks: int) -> None:
    config = write_config(tmp_path, ranks)
    outputs = launch_ranks(config, ranks)
    check_sweep(tmp_path, ranks, "gloo")
    assert '"run_summary"' in outputs[0]
    assert '"run_summary"' not in outputs[1]


@pytest.mark.multiproc
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed on this machine")
def test_mpi_sweep_through_the_launcher(tmp_path: Path) -> None:
    """The launcher pod's path: mpirun runs the task's runner.command (mlbench-runner collectives) with mpi4py."""
    config = write_config(tmp_path, 2, backend="mpi")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    proc = subprocess.run(
        launcher_command(config, hostfile, tmp_path / "termination-log", oversubscribe=True),
        env=env(MASTER_PORT=str(free_port())),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_sweep(tmp_path, 2, "mpi")
    message = (tmp_path / "termination-log").read_text()
    assert len(message.encode()) < 4096
    summary = RunSummary.from_termination_message(message)
    assert summary.stop_reason == "completed"
    assert summary.collectives is None
    assert set(summary.peak_bus_bandwidth or {}) == {"all-reduce", "all-gather", "broadcast"}


@pytest.mark.multiproc
def test_one_rank_under_the_default_train_command(tmp_path: Path) -> None:
    """``mlbench-runner train`` (the default runner.command) on a collectives config times, it does not train."""
    config = write_config(tmp_path, 1)
    launch_ranks(config, 1, subcommand="train")
    result = check_sweep(tmp_path, 1, "gloo")
    assert all(r.bus_bandwidth == 0 for r in result.rows)  # n = 1: nothing crosses a link


@pytest.mark.multiproc
def test_wrong_inputs_fail_with_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path / "two", 2)
    alone = subprocess.run(
        [sys.executable, "-m", "mlbench_runner.cli", "collectives", "--config", str(config)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert alone.returncode == 2
    assert "worldSize: the config says 2 ranks but 1 were started" in alone.stderr
    training = tmp_path / "training.json"
    training.write_text(make_config(logreg_task(), tmp_path, 1).dump())
    wrong = subprocess.run(
        [sys.executable, "-m", "mlbench_runner.cli", "collectives", "--config", str(training)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert wrong.returncode == 2
    assert "collectives: task 'test-task' is a training task" in wrong.stderr


@pytest.mark.multiproc
def test_the_sweep_serves_its_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, one rank: the gauges of every (op, size) and the iteration counter are set."""
    from prometheus_client import generate_latest

    from mlbench_runner.metrics import COLLECTIVE_METRIC_NAMES, CollectiveMetrics

    served: list[CollectiveMetrics] = []
    monkeypatch.setattr(CollectiveMetrics, "serve", lambda self, port: served.append(self))
    monkeypatch.setenv("MLBENCH_THREADS", "1")
    config = make_config(collectives_task(operations=["all-reduce"], maxBytes=64), tmp_path, 1)
    summary = coll.run_collectives(config, World(0, 1, 0, 1, "127.0.0.1", 0, "single"))
    assert summary is not None
    assert summary.collectives is not None
    page = generate_latest(served[0].registry).decode()
    for name in COLLECTIVE_METRIC_NAMES:
        assert name in page, name
    assert 'mlbench_collective_bus_bandwidth_bytes_per_second{bytes="64",op="all-reduce"}' in page
    assert 'mlbench_collective_latency_seconds{bytes="16",op="all-reduce",quantile="0.99"}' in page
    assert f"mlbench_steps_total {float(summary.steps)}" in page
    assert [r.bytes for r in summary.collectives.rows] == [4, 16, 64]


@pytest.mark.parametrize(
    ("task", "match"),
    [
        (collectives_task(operations=["all-reduce"], maxBytes=64), "worldSize: the config says 2 ranks but 1 were"),
        (logreg_task(), "collectives: task 'test-task' is a training task"),  # the task's section is asked first
    ],
)
def test_a_wrong_world_or_task_stops_before_the_event_log(tmp_path: Path, task: dict[str, Any], match: str) -> None:
    """In process: the rank session (as a training rank's) refuses a world of another size, before it opens rank
    0's event log; a training task is refused before that."""
    with pytest.raises(ValueError, match=match):
        coll.run_collectives(make_config(task, tmp_path / "out", 2), World(0, 1, 0, 1, "127.0.0.1", 0, "single"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("variable", "value"), [("MLBENCH_THREADS", "0"), ("MLBENCH_METRICS_LINGER_SECONDS", "soon")])
def test_a_bad_knob_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """The collective benchmark reads its knobs through options.KNOBS, as training does."""
    monkeypatch.setenv(variable, value)
    config = make_config(collectives_task(operations=["all-reduce"], maxBytes=64), tmp_path, 1)
    with pytest.raises(ValueError, match=variable):
        coll.run_collectives(config, World(0, 1, 0, 1, "127.0.0.1", 0, "single"))


def test_format_table_lists_every_row() -> None:
    rows = [
        CollectiveMeasurement(
            op="all-reduce",
            bytes=1 << 20,
            elements=1 << 18,
            iterations=20,
            time_seconds=0.001,
            algorithm_bandwidth=1.048576e9,
            bus_bandwidth=1.572864e9,
            bus_factor=1.5,
            latency_mean_seconds=0.001,
            latency_min_seconds=0.001,
            latency_p50_seconds=0.001,
            latency_p90_seconds=0.001,
            latency_p99_seconds=0.001,
            latency_max_seconds=0.001,
        )
    ]
    text = collective_table.format_table(
        CollectiveResult(backend="mpi", world_size=4, device="cpu", warmup_iterations=5, rows=rows)
    )
    assert "1 MiB" in text
    assert "1.049" in text
    assert "1.573" in text
    assert len(text.splitlines()) == 3
