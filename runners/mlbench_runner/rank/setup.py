"""What a training rank builds before its first step: the device, the communicator, the data, the model, the
algorithm, and the step itself (the fast path, captured and verified on every rank, or the eager reference);
:class:`Setup` holds it for the rest of the run. The training loop is :mod:`mlbench_runner.rank.train`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from mlbench_api.config import RunConfig
from mlbench_api.model import ModelName
from mlbench_runner.algorithms import DistributedAlgorithm, make_algorithm
from mlbench_runner.algorithms.base import CommunicationPlan, FlatGradients
from mlbench_runner.comm import Communicator, CountingCommunicator, gather_texts, make_communicator
from mlbench_runner.data import load_dataset
from mlbench_runner.metrics import RunnerMetrics
from mlbench_runner.options import Options
from mlbench_runner.rank import hostinfo, partition
from mlbench_runner.rank.models import build_model
from mlbench_runner.rank.session import RankSession
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
from mlbench_runner.timing import PhaseTimer
from mlbench_runner.world import World, node_name

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


def precision_label(opts: Options, device: torch.device) -> str:
    dtype = "fp64" if opts.dtype == torch.float64 else "fp32"
    cuda = device.type == "cuda"
    label = "bf16-autocast" if opts.precision == "bf16" and cuda else dtype
    return label + ("+channels_last" if opts.channels_last and cuda else "")


class TrainerSetup(RankSession):
    """A rank that builds its :class:`Setup` (:meth:`_setup`): the device, the data, the model, the algorithm and
    the step, the fast one where it applies."""

    #: What :meth:`_setup` built (None before it has, or when it failed).
    setup: Setup | None = None

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
        metrics.uncompressed_bytes_per_step.set(plan.uncompressed_bytes_per_step)
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

    def _any_rank(self, device: torch.device, flag: bool) -> bool:
        """:meth:`_any` before the set-up exists (the communicator does)."""
        assert self.comm is not None
        t = torch.tensor([1.0 if flag else 0.0], device=device)
        self.comm.all_reduce_sum_(t)
        return bool(t.item() > 0)
