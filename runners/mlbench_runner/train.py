"""One rank's training run: RunConfig in, RunSummary out (rank 0).

The loop is deliberately flat: per step the timed phases (data, forward, backward, then
the algorithm's compression and communication, optimizer, and the algorithm's after-step),
per epoch an evaluation on every rank's test shard with the counts all-reduced, and
collective stopping decisions so all ranks leave at one step.

Knobs that are not part of the run configuration (debug/benchmark only, documented in
docs/runner.md): ``MLBENCH_DTYPE`` (float32|float64), ``MLBENCH_PRECISION`` (fp32|bf16,
GPU only), ``MLBENCH_CHANNELS_LAST``, ``MLBENCH_MAX_STEPS``, ``MLBENCH_TRACE_PARAMS``,
``MLBENCH_THREADS``, ``MLBENCH_METRICS_LINGER_SECONDS``; ``MLBENCH_TRACE_GOSSIP`` is read by
decentralized-sgd.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mlbench_api.config import RunConfig
from mlbench_api.results import CommunicationRecord, RunSummary
from mlbench_api.task import GoalMode, ModelName
from mlbench_runner import partition
from mlbench_runner.algorithms import DistributedAlgorithm, make_algorithm
from mlbench_runner.comm import Communicator, CountingCommunicator, make_communicator
from mlbench_runner.data import load_dataset
from mlbench_runner.events import EventLog
from mlbench_runner.metrics import RunnerMetrics
from mlbench_runner.models import build_model
from mlbench_runner.schedule import learning_rate
from mlbench_runner.summary import SummaryBuilder
from mlbench_runner.tasks import ImageClassification, LinearClassification, TaskKernel
from mlbench_runner.timing import PhaseTimer, WallClock
from mlbench_runner.world import World, detect_world

EVAL_BATCH = 500
FLUSH_EVERY = 25
PROGRESS_SECONDS = 5.0


@dataclass
class Options:
    """Execution choices outside the RunConfig (environment knobs, see module doc)."""

    dtype: torch.dtype = torch.float32
    precision: str = "fp32"
    channels_last: bool = False
    max_steps: int | None = None
    trace_params: bool = False
    threads: int | None = None
    linger_seconds: float = 0.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Options:
        env = dict(os.environ if env is None else env)
        dtypes = {"float32": torch.float32, "float64": torch.float64}
        name = env.get("MLBENCH_DTYPE", "float32")
        if name not in dtypes:
            raise ValueError(f"MLBENCH_DTYPE: {name!r} is not float32 or float64")
        precision = env.get("MLBENCH_PRECISION", "fp32")
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"MLBENCH_PRECISION: {precision!r} is not fp32 or bf16")
        return cls(
            dtype=dtypes[name],
            precision=precision,
            channels_last=env.get("MLBENCH_CHANNELS_LAST", "0") == "1",
            max_steps=int(env["MLBENCH_MAX_STEPS"]) if env.get("MLBENCH_MAX_STEPS") else None,
            trace_params=env.get("MLBENCH_TRACE_PARAMS", "0") == "1",
            threads=int(env["MLBENCH_THREADS"]) if env.get("MLBENCH_THREADS") else None,
            linger_seconds=float(env.get("MLBENCH_METRICS_LINGER_SECONDS", "0")),
        )


@dataclass
class RankRecord:
    """What each rank writes to ``<output>/ranks/rank-<r>.json`` (for tests and debugging)."""

    rank: int
    steps: int = 0
    stop_reason: str = ""
    epochs_completed: int = 0
    param_sha1: list[str] = field(default_factory=list)
    param_values: list[list[float]] = field(default_factory=list)  # only for models of <= 4096 numbers
    lrs: list[float] = field(default_factory=list)
    buffer_sha1: list[str] = field(default_factory=list)  # at each evaluation, after before_evaluation
    accuracies: list[float] = field(default_factory=list)


def available_cpus() -> int:
    """CPUs this process may use: the cgroup quota (a pod's CPU limit) if any, else its affinity."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
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

    # -- set-up ---------------------------------------------------------------------
    def _setup(self) -> None:
        cfg, opts = self.config, self.opts
        self.device = pick_device(cfg, self.world)
        self.comm: Communicator = make_communicator(self.world, cfg.backend.value, cfg.algorithm.value == "ddp")
        self.log.event("init_start", world_size=self.world.size, launcher=self.world.launcher, device=str(self.device))
        torch.manual_seed(cfg.seed)
        # Served before the (possibly long) data ingest: Prometheus sees the rank up, at epoch 0,
        # instead of a target that is down until the data is decoded (MLBenchWorkerUnreachable).
        self.metrics = RunnerMetrics(
            cfg.run_name,
            cfg.task_name,
            cfg.backend.value,
            world_size=self.world.size,
            algorithm=cfg.algorithm.value,
            rank=self.rank,
        )
        port = cfg.metrics_port + self.world.local_rank if cfg.metrics_port else 0
        self.metrics.serve(port)
        task = cfg.task
        data = load_dataset(task.dataset)
        # One-time ingest (decoding the source into the .npy cache, or waiting for the rank
        # that does) is not part of the run, as MLPerf's data reformatting; reading the cache is.
        self.clock.exclude(data.ingest_seconds)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(cfg.seed * 7919 + self.rank)
        use_cl = opts.channels_last and self.device.type == "cuda"
        self.kernel: TaskKernel
        if task.model.name is ModelName.RESNET:
            if data.kind != "image":
                raise ValueError("dataset: a resnet task needs an image dataset")
            self.kernel = ImageClassification(data, self.device, opts.dtype, self.generator, use_cl)
        else:
            self.kernel = LinearClassification(data, self.device, opts.dtype, task.training.l2_regularization)
        model = build_model(task.model, features=data.features).to(self.device, opts.dtype)
        if use_cl:
            model = model.to(memory_format=torch.channels_last)
        # The algorithm's own view of the transport counts the bytes it sends (the trainer's evaluation and
        # stopping collectives go around it).
        self.algorithm_comm = CountingCommunicator(self.comm)
        self.algorithm: DistributedAlgorithm = make_algorithm(
            cfg.algorithm.value, self.algorithm_comm, cfg.bucketing.value, cfg.algorithm_parameters, cfg.seed
        )
        self.model = self.algorithm.prepare(model)
        self.plan = self.algorithm.plan(self.model)
        self.metrics.bytes_per_step.set(self.plan.bytes_per_step)
        self.step_bytes = 0
        self.optimizer = self.algorithm.make_optimizer(cfg, self.model)
        self.batch = task.training.batch_size_per_worker
        self.steps_per_epoch = partition.steps_per_epoch(self.kernel.n_train, self.batch, self.world.size)
        self.autocast = self.opts.precision == "bf16" and self.device.type == "cuda"
        self.timer = PhaseTimer(self.device)
        self.summary = SummaryBuilder(cfg, self.world, self.device, self.precision_label())
        self.log.event(
            "hyperparameters",
            task=cfg.task_name,
            model=task.model.to_api(),
            dataset={
                "name": task.dataset.name,
                "source": data.source,
                "train": self.kernel.n_train,
                "test": self.kernel.n_test,
                "ingest_s": round(data.ingest_seconds, 3),
            },
            batch_size_per_worker=self.batch,
            global_batch_size=self.batch * self.world.size,
            steps_per_epoch=self.steps_per_epoch,
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
            communication=self.plan.record(None).to_api(),
            network=cfg.network.to_api() if cfg.network else None,
            precision=self.precision_label(),
            metrics_port=port,
        )

    def precision_label(self) -> str:
        dtype = "fp64" if self.opts.dtype == torch.float64 else "fp32"
        cuda = getattr(self, "device", torch.device("cpu")).type == "cuda"
        label = "bf16-autocast" if self.opts.precision == "bf16" and cuda else dtype
        return label + ("+channels_last" if self.opts.channels_last and cuda else "")

    # -- collective helpers -----------------------------------------------------------
    def _any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank."""
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        self.comm.all_reduce_sum_(t)
        return bool(t.item() > 0)

    def _budget_exceeded(self) -> bool:
        """Rank 0's clock is the run's clock (it reports wallClockSeconds), so rank 0 decides."""
        budget = self.config.time_budget_seconds
        if budget is None:
            return False
        flag = torch.tensor([1.0 if self.clock.elapsed() >= budget else 0.0], device=self.device)
        self.comm.broadcast_(flag, src=0)
        return bool(flag.item() > 0)

    # -- phases -----------------------------------------------------------------------
    def evaluate(self) -> tuple[float, float]:
        """Accuracy and mean loss over the whole test split (each rank its shard)."""
        self.algorithm.before_evaluation(self.model)
        try:
            return self._evaluate()
        finally:
            self.algorithm.after_evaluation(self.model)

    def _evaluate(self) -> tuple[float, float]:
        if self.opts.trace_params:
            self.record.buffer_sha1.append(buffers_sha1(self.model))
        self.model.eval()
        # The bare module: DDP's forward would broadcast buffers, a collective that would hang
        # when ranks' test shards need different numbers of batches.
        net = getattr(self.model, "module", self.model)
        idx_all = partition.eval_shard(self.kernel.n_test, self.rank, self.world.size).to(self.device)
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext()
        with torch.no_grad(), autocast:
            for start in range(0, len(idx_all), EVAL_BATCH):
                x, y = self.kernel.test_batch(idx_all[start : start + EVAL_BATCH])
                out = net(x)
                totals[0] += self.kernel.correct(out, y)
                totals[1] += len(y)
                totals[2] += self.kernel.loss(out, y, net).double() * len(y)
        self.comm.all_reduce_sum_(totals)
        self.model.train()
        correct, count, loss_sum = totals.tolist()
        return correct / count, loss_sum / count

    def _flush(self, wait: bool = False) -> None:
        steps = self.timer.flush(wait=wait)
        self.metrics.observe_steps(steps, self.batch)
        self.summary.add_steps(steps)

    def _step(self, step: int, idx: torch.Tensor, lr: float) -> torch.Tensor:
        timer = self.timer
        timer.start_step(step)
        with timer.phase("data"):
            x, y = self.kernel.train_batch(idx)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext()
        with timer.phase("forward"), autocast:
            loss = self.kernel.loss(self.model(x), y, self.model)
        with timer.phase("backward"):
            loss.backward()
        sent = self.algorithm_comm.bytes
        self.algorithm.synchronize(self.model, timer)  # opens its compression and communication phases
        with timer.phase("optimizer"):
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.algorithm.zero_grad(self.model)
        self.algorithm.after_step(self.model, timer)
        self.step_bytes += self.algorithm_comm.bytes - sent
        self.metrics.bytes_sent.inc(self.algorithm_comm.bytes - sent)
        timer.end_step()
        return loss.detach()

    # -- the run ----------------------------------------------------------------------
    def run(self) -> RunSummary | None:
        cfg = self.config
        self.log.event("run_start", run=cfg.run_name, task=cfg.task_name, rank_count=self.world.size)
        status = "aborted"
        try:
            self._setup()
            status = self._train()
        except Exception as exc:
            self.log.error("run_error", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._finish(status)
        return self.summary.result

    def _train(self) -> str:
        cfg, rec = self.config, self.record
        training = cfg.task.training
        accuracy_after_time = cfg.task.goal.mode is GoalMode.ACCURACY_AFTER_TIME
        step = 0
        last_progress = time.perf_counter()
        self.log.event("init_stop")
        for epoch in range(training.max_epochs):
            self.metrics.epoch.set(epoch)
            self.log.event("epoch_start", epoch=epoch + 1)
            order = partition.shard(
                self.kernel.n_train, self.batch, self.rank, self.world.size, seed=cfg.seed, epoch=epoch
            )
            order = order.to(self.device)
            loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
            stop_early = ""
            for s in range(self.steps_per_epoch):
                lr = learning_rate(cfg.lr, step, self.steps_per_epoch)
                loss_sum += self._step(step, order[s * self.batch : (s + 1) * self.batch], lr)
                step += 1
                rec.steps = step
                if self.opts.trace_params:
                    rec.param_sha1.append(params_sha1(self.model))
                    values = [p.detach().reshape(-1) for p in self.model.parameters()]
                    if sum(v.numel() for v in values) <= 4096:
                        rec.param_values.append(torch.cat(values).double().cpu().tolist())
                    rec.lrs.append(lr)
                if step % FLUSH_EVERY == 0:
                    self._flush()
                    self.metrics.lr.set(lr)
                    self.metrics.epoch.set(epoch + (s + 1) / self.steps_per_epoch)
                    if self.rank == 0 and time.perf_counter() - last_progress >= PROGRESS_SECONDS:
                        last_progress = time.perf_counter()
                        self.log.event(
                            "train_progress",
                            epoch=epoch + 1,
                            step=step,
                            steps_per_epoch=self.steps_per_epoch,
                            samples_per_second=self.summary.throughput(),
                            elapsed_s=round(self.clock.elapsed(), 3),
                        )
                if self.opts.max_steps is not None and step >= self.opts.max_steps:
                    stop_early = "max-steps"
                    break
                if accuracy_after_time and step % FLUSH_EVERY == 0 and self._budget_exceeded():
                    stop_early = "time-budget"
                    break
            self._flush(wait=True)
            mean_loss = float(loss_sum.item()) / max(1, s + 1)
            self.metrics.loss.set(mean_loss)
            self.metrics.throughput.set(self.summary.throughput())
            if stop_early == "max-steps":
                rec.stop_reason = stop_early
                self.summary.stop(step, step / self.steps_per_epoch, self.clock.elapsed())
                return "goal-not-reached"
            eval_start = time.perf_counter()
            accuracy, _test_loss = self.evaluate()
            self.summary.add_evaluation(time.perf_counter() - eval_start)
            self.metrics.phase_seconds.labels("evaluation").inc(time.perf_counter() - eval_start)
            elapsed = self.clock.elapsed()
            rec.epochs_completed = epoch + 1
            rec.accuracies.append(accuracy)
            self.metrics.accuracy.set(accuracy)
            self.metrics.epoch.set(step / self.steps_per_epoch)
            self.summary.add_epoch(epoch + 1, accuracy, mean_loss, elapsed, lr)
            self.log.event(
                "eval_accuracy", epoch=epoch + 1, accuracy=accuracy, target=cfg.goal_target, elapsed_s=round(elapsed, 3)
            )
            self.log.event(
                "epoch_stop",
                epoch=epoch + 1,
                loss=mean_loss,
                lr=lr,
                step=step,
                samples_per_second=self.summary.throughput(),
                elapsed_s=round(elapsed, 3),
            )
            if self._any(not math.isfinite(mean_loss)):
                rec.stop_reason = "diverged"
                self.summary.stop(step, step / self.steps_per_epoch, elapsed)
                return "aborted"
            reached = accuracy >= cfg.goal_target
            if reached and self.summary.time_to_goal is None:
                self.summary.time_to_goal = elapsed
                self.metrics.goal.set(1)
            if reached and not accuracy_after_time:
                rec.stop_reason = "goal"
                self.summary.stop(step, step / self.steps_per_epoch, elapsed)
                return "success"
            if stop_early == "time-budget" or (accuracy_after_time and self._budget_exceeded()):
                rec.stop_reason = "time-budget"
                self.summary.stop(step, step / self.steps_per_epoch, elapsed)
                return "success" if reached else "goal-not-reached"
        rec.stop_reason = "max-epochs"
        self.summary.stop(step, step / self.steps_per_epoch, self.clock.elapsed())
        last = rec.accuracies[-1] if rec.accuracies else 0.0
        return "success" if accuracy_after_time and last >= cfg.goal_target else "goal-not-reached"

    def _communication(self) -> CommunicationRecord | None:
        """The algorithm's declared bytes per step next to what the communicator counted (rank 0)."""
        plan = getattr(self, "plan", None)
        if plan is None:
            return None
        steps = self.record.steps
        measured = self.step_bytes / steps if steps and self.algorithm.counted else None
        return plan.record(measured)

    def _finish(self, status: str) -> None:
        summary = getattr(self, "summary", None)
        if summary is not None:
            if summary.stopped_at is None:
                summary.stop(
                    self.record.steps,
                    self.record.steps / max(1, getattr(self, "steps_per_epoch", 1)),
                    self.clock.elapsed(),
                )
            result = summary.build(status, self.record.stop_reason or None, self._communication())
            if self.rank == 0:
                (self.out / "summary.json").write_text(result.model_dump_json(by_alias=True, indent=2))
                self.log.event(
                    "run_stop",
                    status=status,
                    stop_reason=self.record.stop_reason,
                    goal_reached=result.goal_reached,
                    wall_clock_s=result.wall_clock_seconds,
                )
                self.log.event("run_summary", summary=json.loads(result.termination_message()))
        else:
            self.log.event("run_stop", status=status, stop_reason="setup-failed")
        ranks = self.out / "ranks"
        ranks.mkdir(parents=True, exist_ok=True)
        self.record.stop_reason = self.record.stop_reason or ("error" if status == "aborted" else status)
        (ranks / f"rank-{self.rank}.json").write_text(json.dumps(self.record.__dict__))
        if self.opts.linger_seconds and status != "aborted" and getattr(self, "metrics", None) is not None:
            time.sleep(self.opts.linger_seconds)  # let Prometheus take a last scrape (a failing rank just exits)
        comm = getattr(self, "comm", None)
        if comm is not None:
            with contextlib.suppress(Exception):
                comm.close()
        self.log.close()


def train(config: RunConfig, world: World | None = None, options: Options | None = None) -> RunSummary | None:
    """Train this rank; rank 0 returns (and writes) the RunSummary."""
    return Trainer(config, world, options).run()
