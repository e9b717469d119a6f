"""One rank's training run: RunConfig in, RunSummary out (rank 0).

The loop is deliberately flat (airbench's shape): :meth:`Trainer._setup` builds a frozen
:class:`Setup`, then per epoch :meth:`Trainer._train_epoch` runs the steps (the timed phases
data, forward, backward, the algorithm's compression and communication, optimizer, and its
after-step; see :mod:`mlbench_runner.rank.steps` for the eager and the fast step),
:meth:`Trainer._evaluate` scores every rank's test shard with the counts all-reduced, and
every way out goes through :meth:`Trainer._stop`. Stopping decisions are collective, so all
ranks leave at one step.

The execution knobs outside the run configuration (``MLBENCH_DTYPE``, ``MLBENCH_FAST_PATH``,
...) are declared once, in :mod:`mlbench_runner.options`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from mlbench_api import atomic
from mlbench_api.config import RunConfig
from mlbench_api.results import CommunicationRecord, EpochRecord, RunStatus, RunSummary, StopReason
from mlbench_api.task import GoalMode, ModelName
from mlbench_runner import stopping
from mlbench_runner.algorithms import DistributedAlgorithm, make_algorithm
from mlbench_runner.algorithms.base import CommunicationPlan, FlatGradients
from mlbench_runner.comm import Communicator, CountingCommunicator, close_quietly, gather_texts, make_communicator
from mlbench_runner.data import load_dataset
from mlbench_runner.events import EventLog
from mlbench_runner.goals import epoch_score
from mlbench_runner.language import task as language_task
from mlbench_runner.metrics import RunnerMetrics
from mlbench_runner.options import Options
from mlbench_runner.rank import checkpoint, hostinfo, partition, rankstate
from mlbench_runner.rank.models import build_model
from mlbench_runner.rank.steps import (
    CaptureCheck,
    EagerStep,
    FastStep,
    PathChoice,
    Step,
    StepPath,
    capture_checked,
    choose_path,
    compile_wanted,
)
from mlbench_runner.rank.summary import ExecutionRecord, SummaryBuilder
from mlbench_runner.rank.tasks import ImageClassification, LinearClassification, TaskKernel
from mlbench_runner.schedule import learning_rate
from mlbench_runner.timing import PhaseTimer, WallClock
from mlbench_runner.world import World, detect_world, node_name

__all__ = ["Options", "RankRecord", "Trainer", "train"]

#: Test images per evaluation batch: the whole split in a few large batches on a GPU.
EVAL_BATCH = {"cpu": 500, "cuda": 2500}
FLUSH_EVERY = 25
PROGRESS_SECONDS = 5.0

#: The fallback reason on a rank whose own capture passed: all ranks run one path.
OTHER_RANK_CAPTURE_FAILED = "another rank's CUDA graph capture failed, eager instead"
#: What a captured step's reason adds when ``MLBENCH_COMPILE=auto``'s torch.compile failed on some rank.
COMPILE_DROPPED = "; without torch.compile, whose attempt failed"


class Captured(NamedTuple):
    """How capturing the fast step went on every rank: the check where it was used, else this rank's own error
    (None where only another rank's failed); ``note`` is what the step's reason adds (a dropped compile)."""

    error: Exception | None
    check: CaptureCheck | None
    note: str = ""


def retry_without_compile(setting: str, compiled: bool, *, succeeded: bool) -> bool:
    """Whether a capture is tried again without torch.compile: when it failed (on some rank) with the model
    compiled because ``MLBENCH_COMPILE`` was ``auto``; ``1`` was the user's request, so its failure is the
    capture's."""
    return not succeeded and compiled and setting == "auto"


def brief_error(error: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, at most ``limit`` characters: torch.compile's errors run to pages (the
    backend's traceback and advice), and a reason is a line of the result."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


def pick_device(config: RunConfig, world: World) -> torch.device:
    """One GPU per local rank for nccl (or when GPUs are requested); the CPU otherwise and for mpi."""
    if config.backend.value == "mpi":
        return torch.device("cpu")
    if config.backend.value == "nccl" or (config.gpus_per_worker > 0 and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("backend: nccl needs a GPU and none is visible")
        index = world.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def params_sha1(model: torch.nn.Module) -> str:
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def buffers_sha1(model: torch.nn.Module) -> str:
    """SHA-1 of the floating-point buffers (BatchNorm running statistics)."""
    h = hashlib.sha1()
    for b in model.buffers():
        if b.is_floating_point():
            h.update(b.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Setup:
    """Everything :meth:`Trainer._setup` builds; fixed for the rest of the run."""

    device: torch.device
    comm: Communicator
    algorithm_comm: CountingCommunicator  # the algorithm's view of comm: counts the bytes it sends
    metrics: RunnerMetrics
    kernel: TaskKernel
    model: nn.Module
    algorithm: DistributedAlgorithm
    plan: CommunicationPlan
    step: Step
    batch: int
    steps_per_epoch: int
    timer: PhaseTimer
    summary: SummaryBuilder
    autocast: bool


@dataclass(frozen=True)
class EpochOutcome:
    """What one epoch's training steps left: the step counter, mean loss, last rate, and an early stop."""

    step: int
    mean_loss: float
    lr: float
    stop: StopReason | None


def status_for(reason: StopReason, reached: bool) -> RunStatus:
    """The run's status for the reason it stopped; ``reached``: the goal held at the stop."""
    if reason == "diverged":
        return "aborted"
    if reason == "goal":
        return "success"
    if reason in ("time-budget", "max-epochs"):
        return "success" if reached else "goal-not-reached"
    return "goal-not-reached"


def precision_label(opts: Options, device: torch.device) -> str:
    dtype = "fp64" if opts.dtype == torch.float64 else "fp32"
    cuda = device.type == "cuda"
    label = "bf16-autocast" if opts.precision == "bf16" and cuda else dtype
    return label + ("+channels_last" if opts.channels_last and cuda else "")


class Trainer:
    """Holds one rank's state; :meth:`run` trains to a stop and returns rank 0's summary."""

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
        self.setup: Setup | None = None
        self.comm: Communicator | None = None  # set as soon as it exists, so a failing set-up still closes it
        self.metrics: RunnerMetrics | None = None
        self.step_bytes = 0
        self._last_progress = time.perf_counter()

    # -- set-up ---------------------------------------------------------------------
    def _setup(self) -> Setup:
        cfg, opts = self.config, self.opts
        device = pick_device(cfg, self.world)
        if device.type == "cuda":
            # Shapes repeat (every step's batch, every evaluation's), so timing cuDNN's algorithms once per shape pays;
            # the fast path does that in the capture's warm-up, before any graph is captured.
            torch.backends.cudnn.benchmark = opts.cudnn_benchmark
        process_group = cfg.algorithm.value == "ddp" or opts.process_group  # DDP needs one even alone
        comm = self.comm = make_communicator(self.world, cfg.backend.value, process_group)
        self.log.event("init_start", world_size=self.world.size, launcher=self.world.launcher, device=str(device))
        nodes = gather_texts(comm, node_name(), device)  # which machine each rank ran on, kept with the result
        hardware = hostinfo.rank_hardware(nodes, gather_texts(comm, hostinfo.this_rank(), device))
        torch.manual_seed(cfg.seed)
        # Served before the (possibly long) data ingest: Prometheus sees the rank up, at epoch 0,
        # instead of a target that is down until the data is decoded (MLBenchWorkerUnreachable).
        metrics = self.metrics = RunnerMetrics(
            cfg.run_name,
            cfg.task_name,
            cfg.backend.value,
            world_size=self.world.size,
            algorithm=cfg.algorithm.value,
            rank=self.rank,
        )
        port = cfg.metrics_port + self.world.local_rank if cfg.metrics_port else 0
        metrics.serve(port)
        task = cfg.task
        data = load_dataset(task.dataset)
        # One-time ingest (decoding the source into the .npy cache, or waiting for the rank
        # that does) is not part of the run, as MLPerf's data reformatting; reading the cache is.
        self.clock.exclude(data.ingest_seconds)
        ingest_wait = self._exclude_slower_setup(device, data.ingest_seconds)
        generator = torch.Generator(device=device)
        generator.manual_seed(cfg.seed * 7919 + self.rank)
        use_cl = opts.channels_last and device.type == "cuda"
        kernel: TaskKernel
        if task.model.name is ModelName.RESNET:
            if data.kind != "image":
                raise ValueError("dataset: a resnet task needs an image dataset")
            kernel = ImageClassification(data, device, opts.dtype, generator, use_cl)
        else:
            kernel = LinearClassification(data, device, opts.dtype, task.training.l2_regularization)
        model = build_model(task.model, features=data.features).to(device, opts.dtype)
        if use_cl:
            model = model.to(memory_format=torch.channels_last)
        algorithm_comm = CountingCommunicator(comm)
        algorithm = make_algorithm(
            cfg.algorithm.value, algorithm_comm, cfg.bucketing.value, cfg.algorithm_parameters, cfg.seed
        )
        model = algorithm.prepare(model)
        plan = algorithm.plan(model)
        metrics.bytes_per_step.set(plan.bytes_per_step)
        batch = task.training.batch_size_per_worker
        timer = PhaseTimer(device, enabled=opts.phase_timing)
        autocast = opts.precision == "bf16" and device.type == "cuda"
        step, execution = self._make_step(
            kernel, model, algorithm, timer=timer, autocast=autocast, device=device, batch=batch
        )
        s = Setup(
            device=device,
            comm=comm,
            algorithm_comm=algorithm_comm,
            metrics=metrics,
            kernel=kernel,
            model=model,
            algorithm=algorithm,
            plan=plan,
            step=step,
            batch=batch,
            steps_per_epoch=partition.steps_per_epoch(kernel.n_train, batch, self.world.size),
            timer=timer,
            summary=SummaryBuilder(
                cfg, self.world, device, precision_label(opts, device), execution, nodes=nodes, hardware=hardware
            ),
            autocast=autocast,
        )
        self.log.event(
            "hyperparameters",
            task=cfg.task_name,
            model=task.model.to_api(),
            dataset={
                "name": task.dataset.name,
                "source": data.source,
                "train": kernel.n_train,
                "test": kernel.n_test,
                "ingest_s": round(data.ingest_seconds, 3),
                "ingest_wait_s": round(ingest_wait, 3),
            },
            batch_size_per_worker=batch,
            global_batch_size=batch * self.world.size,
            steps_per_epoch=s.steps_per_epoch,
            lr=cfg.lr.to_api(),
            momentum=task.training.momentum,
            nesterov=task.training.nesterov,
            weight_decay=task.training.weight_decay,
            l2_regularization=task.training.l2_regularization,
            max_epochs=task.training.max_epochs,
            goal_target=cfg.goal_target,
            goal_mode=task.goal.mode.value,
            algorithm=cfg.algorithm.value,
            algorithm_parameters=cfg.algorithm_parameters.to_api(),
            bucketing=cfg.bucketing.value,
            backend=cfg.backend.value,
            communication=plan.record(None).to_api(),
            network=cfg.network.to_api() if cfg.network else None,
            precision=precision_label(opts, device),
            training_step=execution.path,
            metrics_port=port,
        )
        return s

    def _make_step(
        self,
        kernel: TaskKernel,
        model: nn.Module,
        algorithm: DistributedAlgorithm,
        *,
        timer: PhaseTimer,
        autocast: bool,
        device: torch.device,
        batch: int,
    ) -> tuple[Step, ExecutionRecord]:
        """The fast step where it applies and, on a GPU, captures and verifies; else the eager reference."""
        cfg = self.config
        training = cfg.task.training
        choice = choose_path(self.opts.fast_path, cfg.algorithm.value, training.optimizer.value, device.type)
        grads = getattr(algorithm, "grads", None)
        if choice.path is not StepPath.EAGER and isinstance(grads, FlatGradients):
            fast = FastStep(
                kernel,
                model,
                algorithm,
                grads=grads,
                sgd_options=(cfg.lr.initial_lr, training.momentum, training.nesterov, training.weight_decay),
                timer=timer,
                autocast=autocast,
                compile=compile_wanted(self.opts.compile, choice.path),
            )
            if choice.path is StepPath.FLAT:
                return fast, self._warmed_flat(fast, choice, kernel.synthetic_batch(batch, seed=cfg.seed))
            started = time.perf_counter()
            error, check, dropped = self._capture(fast, kernel, batch, device)
            # The wrapper, the capture's warm-up, the capture, its check and the vote (waiting for the slowest
            # rank's) ran on synthetic batches (no data is read): initialisation, as MLPerf's compile time,
            # left out whichever step follows (a failed attempt is not the eager step's time either).
            seconds = fast.compile_seconds + (time.perf_counter() - started)
            self.clock.exclude(seconds)
            if check is None:
                if self.opts.fast_path == "on":
                    raise error or RuntimeError("MLBENCH_FAST_PATH=on: another rank's CUDA graph capture failed")
                failure = f"CUDA graph capture failed, eager instead: {brief_error(error)}" if error else ""
                choice = PathChoice(StepPath.EAGER, failure or OTHER_RANK_CAPTURE_FAILED)
                # every rank: its own cause
                self.log.warning("fast_path_fallback", reason=choice.reason, attempt_s=round(seconds, 3))
            else:
                self.log.event(
                    "fast_path",
                    capture_s=round(seconds, 3),
                    compile_s=round(fast.compile_seconds, 3),
                    warm_up_and_capture_s=round(check.capture_seconds, 3),
                    verify_s=round(check.verify_seconds, 3),
                    verify_difference=check.difference,
                    compiled=fast.compiled,
                )
                reason = choice.reason + dropped
                return fast, ExecutionRecord(fast.path, reason, seconds, check.difference, fast.compiled)
        optimizer = algorithm.make_optimizer(cfg, model)
        eager = EagerStep(kernel, model, algorithm, optimizer=optimizer, timer=timer, autocast=autocast)
        return eager, ExecutionRecord(StepPath.EAGER, choice.reason)

    def _capture(self, fast: FastStep, kernel: TaskKernel, batch: int, device: torch.device) -> Captured:
        """:meth:`_capture_agreed`, and once more without torch.compile where :func:`retry_without_compile` says.

        auto's torch.compile is a speed-up, not the user's request: the captured step without it comes before
        the eager one. Every rank retries or none does: the vote made the outcome common.
        """
        first = self._capture_agreed(fast, kernel, batch, device)
        if not retry_without_compile(self.opts.compile, fast.compiled, succeeded=first.check is not None):
            return first
        cause = brief_error(first.error) if first.error else "on another rank"
        self.log.warning("compile_fallback", reason=f"torch.compile's attempt failed ({cause}): without it")
        if first.error is not None:
            first.error.__traceback__ = None  # its frames hold the failed capture's tensors and graph pool
        fast.drop_compile()
        return self._capture_agreed(fast, kernel, batch, device)._replace(note=f"{COMPILE_DROPPED} ({cause})")

    def _capture_agreed(self, fast: FastStep, kernel: TaskKernel, batch: int, device: torch.device) -> Captured:
        """Capture and check the fast step, then agree with every rank: the check where all succeeded, else
        None, with this rank's own error (None where only another rank's failed).

        Collective: every rank votes, its capture failed or not, so that no run mixes paths (a rank raising
        alone would leave its peers waiting in the vote).
        """
        cfg = self.config
        error, check = None, None
        try:
            check = capture_checked(fast, kernel, batch, cfg.seed, cfg.lr.initial_lr)
        except Exception as exc:
            error = exc
        if self._any_rank(device, error is not None):
            fast.graphs = None
            return Captured(error, None)
        return Captured(None, check)

    def _warmed_flat(
        self, fast: FastStep, choice: PathChoice, batch: tuple[torch.Tensor, torch.Tensor]
    ) -> ExecutionRecord:
        """The flat step (no graphs); compiled (MLBENCH_COMPILE) on a synthetic batch first, outside the clock."""
        if not fast.compiled:
            return ExecutionRecord(choice.path, choice.reason)
        seconds = fast.compile_seconds + fast.warm_up(*batch)
        self.clock.exclude(seconds)
        seconds += self._exclude_slower_setup(batch[0].device, seconds)  # else the first all-reduce waits for it
        self.log.event(
            "fast_path", capture_s=round(seconds, 3), compile_s=round(fast.compile_seconds, 3), compiled=True
        )
        return ExecutionRecord(choice.path, choice.reason, seconds, compiled=True)

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

    def _any(self, s: Setup, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank."""
        return self._any_rank(s.device, flag)

    def _any_rank(self, device: torch.device, flag: bool) -> bool:
        """:meth:`_any` before the set-up exists (the communicator does)."""
        assert self.comm is not None
        t = torch.tensor([1.0 if flag else 0.0], device=device)
        self.comm.all_reduce_sum_(t)
        return bool(t.item() > 0)

    def _budget_exceeded(self, s: Setup) -> bool:
        """Rank 0's clock is the run's clock (it reports wallClockSeconds), so rank 0 decides."""
        budget = self.config.time_budget_seconds
        if budget is None:
            return False
        flag = torch.tensor([1.0 if self.clock.elapsed() >= budget else 0.0], device=s.device)
        s.comm.broadcast_(flag, src=0)
        return bool(flag.item() > 0)

    # -- evaluation -------------------------------------------------------------------
    def _evaluate(self, s: Setup) -> tuple[float, float]:
        """Accuracy and mean loss over the whole test split (each rank its shard, counts all-reduced)."""
        s.algorithm.before_evaluation(s.model)
        try:
            if self.opts.trace_params:
                self.record.buffer_sha1.append(buffers_sha1(s.model))
            s.model.eval()
            # The bare module: DDP's forward would broadcast buffers, a collective that would hang
            # when ranks' test shards need different numbers of batches.
            net = getattr(s.model, "module", s.model)
            idx_all = partition.eval_shard(s.kernel.n_test, self.rank, self.world.size).to(s.device)
            totals = torch.zeros(3, dtype=torch.float64, device=s.device)
            size = EVAL_BATCH.get(s.device.type, EVAL_BATCH["cpu"])
            autocast = torch.autocast("cuda", dtype=torch.bfloat16) if s.autocast else contextlib.nullcontext()
            with torch.no_grad(), autocast:
                for start in range(0, len(idx_all), size):
                    x, y = s.kernel.test_batch(idx_all[start : start + size])
                    out = net(x)
                    totals[0] += s.kernel.correct(out, y)
                    totals[1] += len(y)
                    totals[2] += s.kernel.loss(out, y, net).double() * len(y)
            s.comm.all_reduce_sum_(totals)
            s.model.train()
            correct, count, loss_sum = totals.tolist()
            return correct / count, loss_sum / count
        finally:
            s.algorithm.after_evaluation(s.model)

    # -- the run ----------------------------------------------------------------------
    def run(self) -> RunSummary | None:
        cfg = self.config
        self.log.event("run_start", run=cfg.run_name, task=cfg.task_name, rank_count=self.world.size)
        status: RunStatus = "aborted"
        try:
            self.setup = self._setup()
            status = self._train(self.setup)
        except KeyboardInterrupt:  # a Ctrl-C, or a SIGTERM under stopping.stop_once: not an error of the run
            if status == "aborted":
                self.record.stop_reason = self.record.stop_reason or "interrupted"
                raise
            # else too late to stop anything: training had ended on its own, and the summary says how
        except Exception as exc:
            self.log.error("run_error", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._finish(status)
        return self.setup.summary.result if self.setup else None

    def _train(self, s: Setup) -> RunStatus:
        cfg = self.config
        accuracy_after_time = cfg.task.goal.mode is GoalMode.ACCURACY_AFTER_TIME
        first, step = self._resume(s)
        self.log.event("init_stop")
        self._last_progress = time.perf_counter()
        for epoch in range(first, cfg.task.training.max_epochs):
            outcome = self._train_epoch(s, epoch, step)
            step = outcome.step
            if outcome.stop == "max-steps":
                return self._stop(s, "max-steps", step, reached=False)
            score, elapsed = self._end_epoch(s, epoch, outcome)
            diverged = self._any(s, not math.isfinite(outcome.mean_loss))  # collective: every rank asks
            reached = cfg.task.goal.met(score, cfg.goal_target) and not diverged
            s.metrics.goal.set(1 if reached else 0)  # an accuracy-after-time goal may be lost again
            if diverged:
                return self._stop(s, "diverged", step, reached=False, elapsed=elapsed)
            if reached and s.summary.time_to_goal is None:
                s.summary.time_to_goal = elapsed
            if reached and not accuracy_after_time:
                return self._stop(s, "goal", step, reached=True, elapsed=elapsed)
            if outcome.stop == "time-budget" or (accuracy_after_time and self._budget_exceeded(s)):
                return self._stop(s, "time-budget", step, reached=reached, elapsed=elapsed)
            if epoch + 1 < cfg.task.training.max_epochs:  # the last epoch ends the run: nothing to resume
                self._checkpoint(s, epoch + 1, step)
        scores = self.record.scores
        reached = accuracy_after_time and bool(scores) and cfg.task.goal.met(scores[-1], cfg.goal_target)
        return self._stop(s, "max-epochs", step, reached=reached)

    # -- checkpoints ----------------------------------------------------------------------
    @staticmethod
    def _parts(s: Setup) -> rankstate.Parts:
        generator = getattr(s.kernel, "generator", None)
        return rankstate.Parts(s.model, s.step, s.algorithm, generator, s.summary, s.device)

    def _checkpoint_path(self) -> Path | None:
        folder = self.config.checkpoint_dir
        return Path(folder) / checkpoint.FILE if folder else None

    def _resume(self, s: Setup) -> tuple[int, int]:
        """The epoch and step to start from: 0, 0, or where the run's checkpoint ended (its state loaded on every
        rank, the clock continued from its origin). Collective: rank 0 reads the file and shares it, so every
        rank takes the same decision; a refused checkpoint raises on every rank."""
        path = self._checkpoint_path()
        if path is None:
            return 0, 0
        data = checkpoint.read_shared(s.comm, path, s.device)
        if not data:
            s.summary.resumes = 0
            self.log.event("checkpoint_none", path=str(path))
            return 0, 0
        header, state = checkpoint.open_checkpoint(data, path, checkpoint.identity_of(self.config), self.rank)
        rankstate.restore(state, self._parts(s))
        self.step_bytes = int(state.get("stepBytes", 0))
        s.summary.history = [EpochRecord.model_validate(h) for h in header["history"]]
        s.summary.time_to_goal = header.get("timeToGoal")
        s.summary.resumes = int(header["resumes"]) + 1
        rec = self.record
        rec.epochs_completed, rec.steps = int(header["epoch"]), int(header["step"])
        rec.accuracies, rec.scores = list(header["accuracies"]), list(header["scores"])
        self.clock.resume(float(header["clockOrigin"]))
        self.log.event(
            "checkpoint_resumed",
            path=str(path),
            epoch=rec.epochs_completed,
            step=rec.steps,
            resumes=s.summary.resumes,
            elapsed_s=round(self.clock.elapsed(), 3),
        )
        return rec.epochs_completed, rec.steps

    def _checkpoint(self, s: Setup, epochs: int, step: int) -> None:
        """After an epoch the run goes on from: every rank's state to rank 0, which writes the file atomically.
        Its time stays in the clock (it is the run's)."""
        path = self._checkpoint_path()
        if path is None:
            return
        started = time.perf_counter()
        state = rankstate.capture(self._parts(s))
        state["stepBytes"] = self.step_bytes
        blobs = checkpoint.gather_blobs(s.comm, checkpoint.to_blob(state), s.device)
        if self.rank != 0:
            return
        rec = self.record
        header = {
            "identity": asdict(checkpoint.identity_of(self.config)),
            "epoch": epochs,
            "step": step,
            "clockOrigin": self.clock.origin(),
            "resumes": s.summary.resumes or 0,
            "history": [h.model_dump(mode="json", by_alias=True) for h in s.summary.history],
            "timeToGoal": s.summary.time_to_goal,
            "accuracies": rec.accuracies,
            "scores": rec.scores,
            "writtenAt": time.time(),
        }
        data = checkpoint.encode(header, blobs)
        try:
            checkpoint.write(path, data)
        except OSError as exc:  # a full or read-only volume: the run goes on, the previous checkpoint stands
            self.log.warning("checkpoint_failed", path=str(path), epoch=epochs, error=f"{type(exc).__name__}: {exc}")
            return
        seconds = round(time.perf_counter() - started, 3)
        self.log.event("checkpoint_saved", path=str(path), epoch=epochs, step=step, bytes=len(data), seconds=seconds)

    def _train_epoch(self, s: Setup, epoch: int, step: int) -> EpochOutcome:
        """One epoch's steps (or fewer, on a max-steps or time-budget stop); ``step`` counts from the run's start."""
        cfg, rec = self.config, self.record
        accuracy_after_time = cfg.task.goal.mode is GoalMode.ACCURACY_AFTER_TIME
        s.metrics.epoch.set(epoch)
        self.log.event("epoch_start", epoch=epoch + 1)
        order = partition.shard(s.kernel.n_train, s.batch, self.rank, self.world.size, seed=cfg.seed, epoch=epoch)
        order = order.to(s.device)
        loss_sum = torch.zeros((), device=s.device, dtype=torch.float64)
        stop: StopReason | None = None
        lr, taken = cfg.lr.initial_lr, 0
        for i in range(s.steps_per_epoch):
            lr = learning_rate(cfg.lr, step, s.steps_per_epoch)
            sent = s.algorithm_comm.bytes
            loss_sum += s.step(step, order[i * s.batch : (i + 1) * s.batch], lr)
            self.step_bytes += s.algorithm_comm.bytes - sent
            s.metrics.bytes_sent.inc(s.algorithm_comm.bytes - sent)
            step, taken = step + 1, i + 1
            rec.steps = step
            if self.opts.trace_params:
                self._trace(s, lr)
            if step % FLUSH_EVERY == 0:
                self._progress(s, epoch, taken, step, lr)
            if self.opts.max_steps is not None and step >= self.opts.max_steps:
                stop = "max-steps"
                break
            if accuracy_after_time and step % FLUSH_EVERY == 0 and self._budget_exceeded(s):
                stop = "time-budget"
                break
        self._flush(s, wait=True)
        mean_loss = float(loss_sum.item()) / max(1, taken)
        s.metrics.loss.set(mean_loss)
        s.metrics.throughput.set(s.summary.throughput())
        return EpochOutcome(step, mean_loss, lr, stop)

    def _end_epoch(self, s: Setup, epoch: int, outcome: EpochOutcome) -> tuple[float, float]:
        """Evaluate after an epoch and record it; returns the goal metric's value and the run's elapsed seconds."""
        eval_start = time.perf_counter()
        accuracy, test_loss = self._evaluate(s)
        score = epoch_score(self.config.task.goal.metric, accuracy, test_loss)
        s.summary.add_evaluation(time.perf_counter() - eval_start)
        s.metrics.phase_seconds.labels("evaluation").inc(time.perf_counter() - eval_start)
        elapsed = self.clock.elapsed()
        self.record.epochs_completed = epoch + 1
        self.record.accuracies.append(accuracy)
        self.record.scores.append(score)
        s.metrics.accuracy.set(accuracy)
        s.metrics.epoch.set(outcome.step / s.steps_per_epoch)
        s.summary.add_epoch(epoch + 1, accuracy, outcome.mean_loss, elapsed, outcome.lr, score=score)
        self.log.event(
            "eval_accuracy",
            epoch=epoch + 1,
            accuracy=accuracy,
            metric=self.config.task.goal.metric.value,
            score=score,
            target=self.config.goal_target,
            elapsed_s=round(elapsed, 3),
        )
        self.log.event(
            "epoch_stop",
            epoch=epoch + 1,
            loss=outcome.mean_loss,
            lr=outcome.lr,
            step=outcome.step,
            samples_per_second=s.summary.throughput(),
            elapsed_s=round(elapsed, 3),
        )
        return score, elapsed

    def _stop(
        self, s: Setup, reason: StopReason, step: int, *, reached: bool, elapsed: float | None = None
    ) -> RunStatus:
        """The one way out of training: record why and where, and the status it means."""
        self.record.stop_reason = reason
        s.summary.stop(step, step / s.steps_per_epoch, self.clock.elapsed() if elapsed is None else elapsed)
        return status_for(reason, reached)

    # -- per-step bookkeeping ---------------------------------------------------------------
    def _flush(self, s: Setup, wait: bool = False) -> None:
        steps = s.timer.flush(wait=wait)
        s.metrics.observe_steps(steps, s.batch)
        s.summary.add_steps(steps)

    def _progress(self, s: Setup, epoch: int, taken: int, step: int, lr: float) -> None:
        """Every FLUSH_EVERY steps: resolved timings into the metrics, and rank 0's progress line."""
        self._flush(s)
        s.metrics.lr.set(lr)
        s.metrics.epoch.set(epoch + taken / s.steps_per_epoch)
        if s.summary.steps_timed:  # the first epoch's throughput too, not only at its end
            s.metrics.throughput.set(s.summary.throughput())
        if self.rank == 0 and time.perf_counter() - self._last_progress >= PROGRESS_SECONDS:
            self._last_progress = time.perf_counter()
            self.log.event(
                "train_progress",
                epoch=epoch + 1,
                step=step,
                steps_per_epoch=s.steps_per_epoch,
                samples_per_second=s.summary.throughput(),
                elapsed_s=round(self.clock.elapsed(), 3),
            )

    def _trace(self, s: Setup, lr: float) -> None:
        """MLBENCH_TRACE_PARAMS: the parameters after every step (hash; values for small models)."""
        rec = self.record
        rec.param_sha1.append(params_sha1(s.model))
        values = [p.detach().reshape(-1) for p in s.model.parameters()]
        rec.param_norms.append(float(torch.cat(values).double().norm()))
        if sum(v.numel() for v in values) <= 4096:
            rec.param_values.append(torch.cat(values).double().cpu().tolist())
        rec.lrs.append(lr)

    # -- the end ------------------------------------------------------------------------
    def _communication(self, s: Setup) -> CommunicationRecord:
        """The algorithm's declared bytes per step next to what the communicator counted (rank 0)."""
        steps = self.record.steps
        measured = self.step_bytes / steps if steps and s.algorithm.counted else None
        return s.plan.record(measured)

    def _finish(self, status: RunStatus) -> None:
        stopping.hold()  # a stop signal from now on must not cut the summary short
        s = self.setup
        if self.record.stop_reason is None:  # an exception ended the run before any stop decision
            # A peer that stopped on the same Ctrl-C can fail this rank's collective before its own signal
            # is handled: the signal, not the broken connection, is why the run stopped.
            self.record.stop_reason = "interrupted" if stopping.received() else "setup-failed" if s is None else "error"
        if s is not None:
            summary = s.summary
            if summary.stopped_at is None:
                steps = self.record.steps
                summary.stop(steps, steps / max(1, s.steps_per_epoch), self.clock.elapsed())
            result = summary.build(status, self.record.stop_reason, self._communication(s))
            if self.rank == 0:
                atomic.write_text(self.out / "summary.json", result.model_dump_json(by_alias=True, indent=2))
                self.log.event(
                    "run_stop",
                    status=status,
                    stop_reason=self.record.stop_reason,
                    goal_reached=result.goal_reached,
                    wall_clock_s=result.wall_clock_seconds,
                )
                self.log.event("run_summary", summary=json.loads(result.termination_message()))
        else:
            self.log.event("run_stop", status=status, stop_reason=self.record.stop_reason)
        ranks = self.out / "ranks"
        ranks.mkdir(parents=True, exist_ok=True)
        (ranks / f"rank-{self.rank}.json").write_text(json.dumps(self.record.__dict__))
        if self.opts.linger_seconds and status != "aborted" and self.metrics is not None:
            stopping.linger(self.opts.linger_seconds)  # Prometheus's last scrape (a failing rank just exits)
        if self.comm is not None and (error := close_quietly(self.comm, orderly=status != "aborted")):
            self.log.warning("communicator_close_failed", error=error)
        self.log.close()


def _trained(config: RunConfig, world: World | None, options: Options | None) -> RunSummary | None:
    return Trainer(config, world, options).run()


def _translated(config: RunConfig, world: World | None, options: Options | None) -> RunSummary | None:
    from mlbench_runner.translation import task as translation  # torch-only kinds need not import sacrebleu

    return translation.run(config, world)


def _language_modelled(config: RunConfig, world: World | None, options: Options | None) -> RunSummary | None:
    return language_task.run(config, world)


#: The task kinds this runner trains, by the API's model name: what ``mlbench-runner train`` runs for each. The
#: API's ModelName and this table must agree (tests/runner/test_translation.py checks).
KINDS: dict[ModelName, Callable[[RunConfig, World | None, Options | None], RunSummary | None]] = {
    ModelName.RESNET: _trained,
    ModelName.LOGISTIC_REGRESSION: _trained,
    ModelName.TRANSFORMER: _translated,
    ModelName.AWD_LSTM: _language_modelled,
}


def train(config: RunConfig, world: World | None = None, options: Options | None = None) -> RunSummary | None:
    """Train this rank with the task's kind (:data:`KINDS`); rank 0 returns (and writes) the RunSummary."""
    return KINDS[config.task.model.name](config, world, options)
