"""One rank's state from its first line: who it is (world, options), its clock, event log and rank record, and
what every rank agrees on after a one-time set-up (:meth:`RankSession._exclude_slower_setup`). A training rank and
the collectives benchmark (:func:`~mlbench_runner.rank.collectives.run_collectives`) both start with it, so the
world's size is checked against the config's here only.

The layers of a training rank, each a class on the one before: :class:`RankSession` (here),
:class:`~mlbench_runner.rank.setup.TrainerSetup` (everything built before the first step) and
:class:`~mlbench_runner.rank.train.Trainer` (the epochs, evaluation, checkpoints and the summary).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mlbench_api.config import RunConfig
from mlbench_api.results import StopReason
from mlbench_runner.comm import Communicator
from mlbench_runner.events import EventLog
from mlbench_runner.metrics import RunnerMetrics
from mlbench_runner.options import Options
from mlbench_runner.timing import WallClock
from mlbench_runner.world import World, detect_world


@dataclass
class RankRecord:
    """What each rank writes to ``<output>/ranks/rank-<r>.json`` (for tests and debugging)."""

    rank: int
    steps: int = 0
    stop_reason: StopReason | None = None  #: set by ``_stop``, or by ``_finish`` when an exception ended the run
    epochs_completed: int = 0
    param_sha1: list[str] = field(default_factory=list)
    param_values: list[list[float]] = field(default_factory=list)  # only for models of <= 4096 numbers
    param_norms: list[float] = field(default_factory=list)  # fp64 L2 norm of all parameters (any model size)
    lrs: list[float] = field(default_factory=list)
    buffer_sha1: list[str] = field(default_factory=list)  # at each evaluation, after before_evaluation
    accuracies: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # the goal metric's value at each evaluation


def waited_for_others(waited: float, own: float, slowest: float) -> float:
    """Of the ``waited`` seconds at a meeting after a one-time set-up (this rank's ``own`` seconds of it, the
    slowest rank's ``slowest``), those spent waiting for the others' set-up: at most what the slowest spent
    beyond this rank, and never more than the wait itself. The rest of the wait (ranks that started later, or
    read their data more slowly) is the run's time and stays in the clock."""
    return min(waited, max(0.0, slowest - own))


def quota_cpus(cpu_max: str) -> int | None:
    """Whole CPUs of a cgroup v2 ``cpu.max`` ("<quota> <period>", or "max <period>": no limit, None).

    Rounded down (at least 1): threads beyond the quota (3 on a 2.5-CPU limit) are throttled by the kernel
    in turn and stall each other at every parallel region's barrier, slowing the compute phases they time."""
    try:
        quota, period = cpu_max.split()[:2]
        return None if quota == "max" else max(1, int(quota) // int(period))
    except ValueError:  # unreadable: as no limit
        return None


def available_cpus() -> int:
    """CPUs this process may use: the cgroup quota (a pod's CPU limit) if any, else its affinity."""
    try:
        cpus = quota_cpus(Path("/sys/fs/cgroup/cpu.max").read_text())
    except OSError:
        cpus = None
    if cpus is not None:
        return cpus
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class RankSession:
    """One rank's own state before anything is built (a training rank's, or the collectives sweep's): its world
    (its size checked against the config's), options, clock, event log and rank record, the communicator once it
    exists; and the meeting every training rank holds after a one-time set-up."""

    def __init__(self, config: RunConfig, world: World | None = None, options: Options | None = None) -> None:
        self.clock = WallClock()  # MLPerf: the clock starts before any data is touched
        self.config = config
        self.world = world or detect_world()
        self.opts = options or Options.from_env()
        if config.world_size != self.world.size:
            raise ValueError(f"worldSize: the config says {config.world_size} ranks but {self.world.size} were started")
        threads = self.opts.threads or max(1, available_cpus() // max(1, self.world.local_size))
        torch.set_num_threads(threads)
        self.rank = self.world.rank
        self.out = Path(config.output_dir)
        self.log = EventLog(self.rank, self.out)
        self.record = RankRecord(self.rank)
        self.comm: Communicator | None = None  # set as soon as it exists, so a failing set-up still closes it
        self.metrics: RunnerMetrics | None = None
        self.step_bytes = 0
        self._last_progress = time.perf_counter()

    # -- collective helpers -----------------------------------------------------------
    def _exclude_slower_setup(self, device: torch.device, own: float) -> float:
        """Meet every rank after a one-time set-up this rank spent ``own`` seconds on (left out of its clock by
        the caller), and leave out the part of the wait that was for slower ranks' set-up; returns it.

        Why: without this meeting, the run's first collective waits for the rank that decoded the dataset (a pod
        without the cache) or compiled longest: that set-up would be inside rank 0's clock, which is the run's,
        and inside its communication phase. Collective: every rank calls it at the same point.
        """
        assert self.comm is not None
        if self.comm.alone():
            return 0.0
        started = time.perf_counter()
        slowest = float(self.comm.all_gather(torch.tensor([own], dtype=torch.float64, device=device)).max())
        extra = waited_for_others(time.perf_counter() - started, own, slowest)
        self.clock.exclude(extra)
        return extra
