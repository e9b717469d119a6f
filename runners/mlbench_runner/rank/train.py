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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mlbench_api import atomic
from mlbench_api.config import RunConfig
from mlbench_api.goal import GoalMode
from mlbench_api.model import ModelName
from mlbench_api.results import CommunicationRecord, EpochRecord, RunStatus, RunSummary, StopReason
from mlbench_runner import stopping
from mlbench_runner.comm import close_quietly, gather_texts
from mlbench_runner.goals import epoch_score
from mlbench_runner.language import task as language_task
from mlbench_runner.options import Options
from mlbench_runner.rank import checkpoint, partition, rankstate
from mlbench_runner.rank.session import RankRecord
from mlbench_runner.rank.setup import Setup, TrainerSetup
from mlbench_runner.schedule import learning_rate
from mlbench_runner.world import World

__all__ = ["Options", "RankRecord", "Trainer", "train"]

#: Test images per evaluation batch: the whole split in a few large batches on a GPU.
EVAL_BATCH = {"cpu": 500, "cuda": 2500}
FLUSH_EVERY = 25
PROGRESS_SECONDS = 5.0


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


class Trainer(TrainerSetup):
    """Holds one rank's state; :meth:`run` trains to a stop and returns rank 0's summary."""

    def _any(self, s: Setup, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank."""
        return self._any_rank(s.device, flag)

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
        s.metrics.score.set(score)
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
            if status != "aborted" and self.comm is not None:  # every rank stopped at the same step: compare them
                summary.parameter_digests = gather_texts(self.comm, params_sha1(s.model), s.device)
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
    # Lazy: the torch-only kinds need not import sacrebleu.
    from mlbench_runner.translation import task as translation  # noqa: PLC0415

    return translation.run(config, world)


def _language_modelled(config: RunConfig, world: World | None, options: Options | None) -> RunSummary | None:
    return language_task.run(config, world)


#: The task kinds this runner trains, by the API's model name: what ``mlbench-runner train`` runs for each. The
#: API's ModelName and this table must agree (tests/runner/test_translation.py checks).
KINDS: dict[ModelName, Callable[[RunConfig, World | None, Options | None], RunSummary | None]] = {
    ModelName.RESNET: _trained,
    ModelName.LOGISTIC_REGRESSION: _trained,
    ModelName.TRANSFORMER: _translated,
    ModelName.GNMT: _translated,
    ModelName.AWD_LSTM: _language_modelled,
}


def train(config: RunConfig, world: World | None = None, options: Options | None = None) -> RunSummary | None:
    """Train this rank with the task's kind (:data:`KINDS`); rank 0 returns (and writes) the RunSummary."""
    return KINDS[config.task.model.name](config, world, options)
