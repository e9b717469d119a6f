"""Task 0a: time the backend's collectives over a ladder of message sizes (``mlbench-runner collectives``).

Every rank runs the same sweep over the same :class:`~mlbench_runner.comm.Communicator` that training
uses (gloo or mpi on the CPU, nccl on GPUs). For each operation and size:

1. one validated iteration (inputs ``rank + 1``; a wrong result fails the run), then the remaining
   ``warmupIterations - 1`` untimed ones, whose mean time (averaged over the ranks) estimates the time per
   iteration and, with ``maxSecondsPerSize``, caps the number of timed iterations ``k``;
2. nccl-tests' measurement: a barrier, then ``k`` iterations back to back; the time per iteration is the
   loop's time / ``k``, averaged over the ranks (nccl-tests' default ``-a 1``). From it
   ``algbw = S / t`` and ``busbw = algbw * factor`` (see :func:`bus_factor`);
3. latencies: ``k`` more iterations, each alone after a barrier; an iteration's latency is the slowest
   rank's time, and the row reports its mean, min, max and p50/p90/p99 (linear interpolation).

Definitions (NVIDIA nccl-tests, ``doc/PERFORMANCE.md``, "Performance reported by NCCL tests"):

* ``algbw = S / t``, S in bytes, t in seconds per iteration.
* ``busbw = algbw * 2(n-1)/n`` for all-reduce, ``algbw * (n-1)/n`` for all-gather, ``algbw * 1`` for
  broadcast: the bandwidth the slowest link must sustain, comparable with the hardware's peak whatever
  the number of ranks n.
* S is the size of the *total* array: for all-reduce and broadcast the buffer every rank holds; for
  all-gather the gathered output, ``sendcount * sizeof(float) * n``, so each rank contributes S / n bytes.
  A size that does not split into n float32 elements or more is rounded down to a multiple of n elements
  (the row's ``bytes`` is the size really moved); one below n elements is skipped for all-gather.

Rank 0 writes ``<output>/collectives.json`` (:class:`~mlbench_api.results.CollectiveResult`) and a
:class:`~mlbench_api.results.RunSummary` in ``summary.json`` (status success, stop reason ``completed``,
``peakBusBandwidth`` per operation, the full table under ``collectives``), and prints the ``run_summary``
event the launcher turns into the termination message, exactly as a training run does.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mlbench_api import atomic
from mlbench_api.collectives import COLLECTIVE_ELEMENT_BYTES, CollectiveBenchmark, CollectiveOp
from mlbench_api.config import RunConfig
from mlbench_api.results import (
    CollectiveMeasurement,
    CollectiveResult,
    Environment,
    PhaseTotals,
    RunSummary,
)
from mlbench_runner import stopping
from mlbench_runner.comm import Communicator, close_quietly, make_communicator
from mlbench_runner.events import EventLog
from mlbench_runner.metrics import CollectiveMetrics
from mlbench_runner.options import Options
from mlbench_runner.rank.session import RankSession
from mlbench_runner.rank.setup import pick_device
from mlbench_runner.rank.summary import device_description
from mlbench_runner.world import World

#: The float32 buffers' element type.
DTYPE = torch.float32
#: The latency quantiles every row reports.
QUANTILES = (0.5, 0.9, 0.99)


def bus_factor(op: CollectiveOp | str, world_size: int) -> float:
    """nccl-tests' correction from algbw to busbw: 2(n-1)/n, (n-1)/n or 1; 0 for every operation with one rank.

    One rank moves nothing over a link: nccl-tests would still report a broadcast's algbw, which alone measures
    a stand-in's call overhead (hundreds of TB/s for a no-op) and would stand as the run's peak bus bandwidth.
    """
    n = world_size
    if n < 1:
        raise ValueError(f"world size must be at least 1, got {n}")
    op = CollectiveOp(op)
    if n == 1:
        return 0.0
    if op is CollectiveOp.ALL_REDUCE:
        return 2 * (n - 1) / n
    if op is CollectiveOp.ALL_GATHER:
        return (n - 1) / n
    return 1.0


def algorithm_bandwidth(nbytes: int, seconds: float) -> float:
    """``algbw = S / t`` in bytes per second."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return nbytes / seconds


def bus_bandwidth(op: CollectiveOp | str, nbytes: int, seconds: float, world_size: int) -> float:
    """``busbw = algbw * bus_factor(op, n)`` in bytes per second."""
    return algorithm_bandwidth(nbytes, seconds) * bus_factor(op, world_size)


@dataclass(frozen=True)
class Size:
    """One (operation, size) of the sweep: S in bytes and the float32 elements of each rank's input."""

    op: CollectiveOp
    nbytes: int
    elements: int


def plan(spec: CollectiveBenchmark, world_size: int) -> list[Size]:
    """Every (operation, size) the sweep times, operations in the task's order, sizes increasing.

    All-gather's S is the gathered total: each rank's input is ``S / 4 // n`` elements and S is what that
    really gathers (a multiple of ``4n``); sizes below ``n`` elements are skipped, and a rounding that lands
    on the previous size is not repeated.
    """
    out: list[Size] = []
    for op in spec.operations:
        seen: set[int] = set()
        for nominal in spec.sizes():
            count = nominal // COLLECTIVE_ELEMENT_BYTES
            if op is CollectiveOp.ALL_GATHER:
                per_rank = count // world_size
                nbytes = per_rank * world_size * COLLECTIVE_ELEMENT_BYTES
                if per_rank == 0 or nbytes in seen:
                    continue
                out.append(Size(op, nbytes, per_rank))
            else:
                nbytes = count * COLLECTIVE_ELEMENT_BYTES
                if nbytes in seen:
                    continue
                out.append(Size(op, nbytes, count))
            seen.add(nbytes)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation (numpy's default): monotone in q."""
    if not values:
        raise ValueError("percentile of no values")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q * 100.0))


def timed_iterations(spec: CollectiveBenchmark, seconds_per_iteration: float) -> int:
    """How many iterations each timed loop runs: ``iterations``, lowered (to 1 at least) so that both loops
    fit in ``maxSecondsPerSize`` at the warm-up's time per iteration."""
    if seconds_per_iteration <= 0:
        return spec.iterations
    fit = int(spec.max_seconds_per_size / (2.0 * seconds_per_iteration))
    return max(1, min(spec.iterations, fit))


def warmup_estimate(checked_seconds: float, warm_seconds: float, warm: int) -> float:
    """The warm-up's time per iteration, which sizes the timed loops: the mean of the ``warm`` unchecked warm-up
    iterations, or, with ``warmupIterations: 1`` (none of them), the checked first iteration's time, so that
    ``maxSecondsPerSize`` still holds (an estimate of 0 would run every asked iteration)."""
    return warm_seconds / warm if warm > 0 else checked_seconds


def measurement(
    size: Size,
    world_size: int,
    iterations: int,
    loop_seconds: float,
    latencies: Sequence[float],
) -> CollectiveMeasurement:
    """One row from the two loops' timings: ``loop_seconds`` per iteration (ranks' mean), ``latencies`` per
    iteration (slowest rank's)."""
    factor = bus_factor(size.op, world_size)
    algbw = algorithm_bandwidth(size.nbytes, loop_seconds)
    p50, p90, p99 = (percentile(latencies, q) for q in QUANTILES)
    return CollectiveMeasurement(
        op=size.op.value,
        bytes=size.nbytes,
        elements=size.elements,
        iterations=iterations,
        time_seconds=loop_seconds,
        algorithm_bandwidth=algbw,
        bus_bandwidth=algbw * factor,
        bus_factor=factor,
        latency_mean_seconds=float(np.mean(latencies)),
        latency_min_seconds=float(min(latencies)),
        latency_p50_seconds=p50,
        latency_p90_seconds=p90,
        latency_p99_seconds=p99,
        latency_max_seconds=float(max(latencies)),
    )


class CollectiveError(RuntimeError):
    """A collective returned wrong data: the transport is broken, the figures would mean nothing."""


class Sweep:
    """One rank's sweep; :meth:`run` times every (operation, size) and returns the table (the same on every
    rank: the timings are combined with collectives)."""

    def __init__(
        self,
        spec: CollectiveBenchmark,
        comm: Communicator,
        device: torch.device,
        *,
        on_row: Callable[[CollectiveMeasurement], None] | None = None,
        on_iterations: Callable[[int], None] | None = None,
    ) -> None:
        self.spec, self.comm, self.device = spec, comm, device
        self.on_row, self.on_iterations = on_row, on_iterations
        self.rank, self.size = comm.rank, comm.size
        self.timed_seconds = 0.0  # this rank's seconds inside the timed loops
        self.iterations_done = 0

    # -- helpers -------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _mean_over_ranks(self, values: Sequence[float]) -> list[float]:
        """Each value averaged over the ranks (float64 sum all-reduce; identical result on every rank)."""
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        self.comm.all_reduce_sum_(t)
        return [v / self.size for v in t.cpu().tolist()]

    def _max_over_ranks(self, values: Sequence[float]) -> list[float]:
        """Each value's maximum over the ranks (all-gather; identical on every rank)."""
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        gathered = self.comm.all_gather(t)
        return [float(v) for v in gathered.max(dim=0).values.cpu().tolist()]

    def _operation(self, size: Size) -> tuple[Callable[[], object], Callable[[], None], Callable[[], None]]:
        """(run once, fill the validation inputs, check the validation outputs) for one (op, size)."""
        n, rank, comm = self.size, self.rank, self.comm
        buf = torch.zeros(size.elements, dtype=DTYPE, device=self.device)
        out: list[torch.Tensor] = []

        def fill() -> None:
            buf.fill_(float(rank + 1))

        if size.op is CollectiveOp.ALL_REDUCE:

            def run() -> object:
                comm.all_reduce_sum_(buf)
                return None

            def check() -> None:
                expected = n * (n + 1) / 2
                _expect(bool(torch.all(buf == expected)), size, f"every element {expected}")
                buf.zero_()  # timed sums of zeros stay zeros (no overflow to inf over many iterations)

        elif size.op is CollectiveOp.ALL_GATHER:

            def run() -> object:
                out[:] = [comm.all_gather(buf)]
                return None

            def check() -> None:
                gathered = out[0]
                want = torch.arange(1, n + 1, dtype=DTYPE, device=self.device).unsqueeze(1).expand(n, size.elements)
                _expect(tuple(gathered.shape) == (n, size.elements), size, f"shape ({n}, {size.elements})")
                _expect(bool(torch.equal(gathered, want)), size, "rank r's block filled with r + 1")
                out.clear()

        else:

            def run() -> object:
                comm.broadcast_(buf, 0)
                return None

            def check() -> None:
                _expect(bool(torch.all(buf == 1.0)), size, "every element 1 (rank 0's)")

        return run, fill, check

    # -- the sweep -----------------------------------------------------------------------------
    def measure(self, size: Size) -> CollectiveMeasurement:
        """Validate, warm up, then the two timed loops of one (operation, size)."""
        run, fill, check = self._operation(size)
        fill()
        self.comm.barrier()
        start = time.perf_counter()
        run()
        self._sync()
        checked = time.perf_counter() - start
        self._check_on_every_rank(check, size)
        warm = self.spec.warmup_iterations - 1
        self.comm.barrier()
        start = time.perf_counter()
        for _ in range(warm):
            run()
        self._sync()
        per_warm = warmup_estimate(checked, time.perf_counter() - start, warm)
        (estimate,) = self._mean_over_ranks([per_warm])
        k = timed_iterations(self.spec, estimate)

        # nccl-tests: k iterations back to back, the time per iteration averaged over the ranks
        self.comm.barrier()
        start = time.perf_counter()
        for _ in range(k):
            run()
        self._sync()
        loop = time.perf_counter() - start
        self.timed_seconds += loop
        (per_iteration,) = self._mean_over_ranks([loop / k])
        self._progress(k)

        # latencies: every iteration alone after a barrier; the slowest rank's time counts
        mine: list[float] = []
        for _ in range(k):
            self.comm.barrier()
            start = time.perf_counter()
            run()
            self._sync()
            mine.append(time.perf_counter() - start)
        self.timed_seconds += sum(mine)
        latencies = self._max_over_ranks(mine)
        self._progress(k)
        row = measurement(size, self.size, k, per_iteration, latencies)
        if self.on_row is not None:
            self.on_row(row)
        return row

    def _check_on_every_rank(self, check: Callable[[], None], size: Size) -> None:
        """Run this rank's check, then agree on it: every rank raises when any found wrong data. A rank that
        raised alone would leave its peers in the next collective (until nccl's timeout; gloo's peers would
        report a closed connection, not the wrong data); a broadcast's root, which sends its own data, cannot
        see a receiver's corruption at all."""
        try:
            check()
            failure: CollectiveError | None = None
        except CollectiveError as exc:
            failure = exc
        (failed,) = self._max_over_ranks([1.0 if failure is not None else 0.0])
        if failure is not None:
            raise failure
        if failed:
            raise CollectiveError(f"{size.op.value} of {size.nbytes} bytes returned wrong data on another rank")

    def _progress(self, iterations: int) -> None:
        self.iterations_done += iterations
        if self.on_iterations is not None:
            self.on_iterations(iterations)

    def run(self) -> list[CollectiveMeasurement]:
        return [self.measure(size) for size in plan(self.spec, self.size)]


def _expect(ok: bool, size: Size, what: str) -> None:
    if not ok:
        raise CollectiveError(f"{size.op.value} of {size.nbytes} bytes returned wrong data (expected {what})")


def device_name(device: torch.device) -> str:
    return device_description(device)


def _sweep_spec(config: RunConfig) -> CollectiveBenchmark:
    """The task's sweep; raises ValueError for a training task (the world's size is the rank session's check)."""
    spec = config.task.collectives
    if spec is None:
        raise ValueError(
            f"collectives: task {config.task_name!r} is a training task (no collectives section); "
            "run it with mlbench-runner train"
        )
    return spec


def _row_recorder(rank: int, registry: CollectiveMetrics, log: EventLog) -> Callable[[CollectiveMeasurement], None]:
    """What rank 0 does with each measured row (the others nothing): its gauges and a ``collective`` event."""

    def on_row(row: CollectiveMeasurement) -> None:
        if rank != 0:
            return
        labels = (row.op, str(row.bytes))
        registry.algorithm_bandwidth.labels(*labels).set(row.algorithm_bandwidth)
        registry.bus_bandwidth.labels(*labels).set(row.bus_bandwidth)
        for q, value in zip(
            QUANTILES, (row.latency_p50_seconds, row.latency_p90_seconds, row.latency_p99_seconds), strict=True
        ):
            registry.latency.labels(*labels, str(q)).set(value)
        log.event("collective", **row.model_dump(mode="json", by_alias=True))

    return on_row


def run_collectives(config: RunConfig, world: World | None = None, opts: Options | None = None) -> RunSummary | None:
    """Time this rank's part of the sweep; rank 0 writes and returns the RunSummary (others return None).

    ``opts`` (default: the ``MLBENCH_*`` knobs of the environment) gives the threads and the metrics linger.
    A :class:`~mlbench_runner.rank.session.RankSession`, as a training rank's, detects the world, checks its size
    against the config's, reads the knobs, sets the threads and opens the event log.
    """
    spec = _sweep_spec(config)
    session = RankSession(config, world, opts)
    world, opts, out, log = session.world, session.opts, session.out, session.log
    comm: Communicator | None = None
    metrics: CollectiveMetrics | None = None
    ended = False  # the sweep ran to its end on this rank (the peers did too: it ends collectively)
    try:
        device = pick_device(config, world)
        comm = make_communicator(world, config.backend.value)
        log.event("init_start", world_size=world.size, launcher=world.launcher, device=str(device))
        metrics = CollectiveMetrics(
            config.run_name, config.task_name, config.backend.value, world_size=world.size, rank=world.rank
        )
        metrics.serve(config.metrics_port + world.local_rank if config.metrics_port else 0)
        sizes = plan(spec, world.size)
        log.event(
            "collectives_start",
            task=config.task_name,
            backend=config.backend.value,
            world_size=world.size,
            operations=[op.value for op in spec.operations],
            sizes=len(sizes),
            min_bytes=spec.min_bytes,
            max_bytes=spec.max_bytes,
            factor=spec.factor,
            iterations=spec.iterations,
            warmup_iterations=spec.warmup_iterations,
            max_seconds_per_size=spec.max_seconds_per_size,
        )
        on_row = _row_recorder(world.rank, metrics, log)
        sweep = Sweep(spec, comm, device, on_row=on_row, on_iterations=metrics.steps.inc)
        rows = sweep.run()
        result = CollectiveResult(
            backend=config.backend.value,
            world_size=world.size,
            device=device_name(device),
            warmup_iterations=spec.warmup_iterations,
            rows=rows,
        )
        wall = session.clock.elapsed()
        summary = _summary(config, world, result, wall, sweep)
        stopping.hold()  # the sweep is done: a stop signal from now on must not turn it into a failure
        if world.rank == 0:
            atomic.write_text(out / "collectives.json", result.model_dump_json(by_alias=True, indent=2))
            atomic.write_text(out / "summary.json", summary.model_dump_json(by_alias=True, indent=2))
            log.event("run_stop", status=summary.status, stop_reason=summary.stop_reason, wall_clock_s=wall)
            log.event("run_summary", summary=json.loads(summary.termination_message()))
        if opts.linger_seconds:
            stopping.linger(opts.linger_seconds)  # Prometheus's last scrape, not past a stop signal
        ended = True
        return summary if world.rank == 0 else None
    except BaseException as exc:
        log.error("run_error", error=f"{type(exc).__name__}: {exc}")
        if world.rank == 0:
            reason = "interrupted" if isinstance(exc, KeyboardInterrupt) or stopping.received() else "error"
            log.event("run_stop", status="aborted", stop_reason=reason)
        raise
    finally:
        if comm is not None and (error := close_quietly(comm, orderly=ended)):
            log.warning("communicator_close_failed", error=error)
        log.close()


def _summary(config: RunConfig, world: World, result: CollectiveResult, wall: float, sweep: Sweep) -> RunSummary:
    """The training result contract, filled for a sweep: success, stop reason completed, no goal."""
    device = result.device
    env = Environment(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        devices=[device],
        precision="fp32",
        world_size=world.size,
        backend=config.backend.value,
        algorithm="collectives",
        seed=config.seed,
        hostname=os.environ.get("HOSTNAME") or socket.gethostname(),
    )
    timed = sweep.timed_seconds
    return RunSummary(
        run=config.run_name,
        task=config.task_name,
        status="success",
        stop_reason="completed",
        goal_reached=True,  # a collectives task's goal is the sweep itself: every operation and size timed
        epochs=0,
        steps=sweep.iterations_done,
        samples=0,
        wall_clock_seconds=wall,
        train_seconds=timed,
        compute_seconds=0.0,
        communication_seconds=timed,
        samples_per_second=0.0,
        phases=PhaseTotals(communication=timed),
        environment=env,
        peak_bus_bandwidth=result.peak_bus_bandwidth(),
        collectives=result,
    )
