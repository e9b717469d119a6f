"""Accumulate one rank's timings into the :class:`RunSummary` result contract.

Definitions (also in docs/runner.md): ``train_seconds`` is the sum over steps of the
six step phases; ``compute_seconds`` = forward + backward + compression + optimizer;
``communication_seconds`` = the communication phase (collectives only); ``samples_per_second`` = the timed
steps' global samples / train_seconds (the same steps); ``wall_clock_seconds`` runs from the start of the run (before
the data is loaded) to the stop, evaluation included.
"""

from __future__ import annotations

import math
import os
import platform
import socket
from dataclasses import dataclass

import torch

from mlbench_api.config import RunConfig
from mlbench_api.goal import better
from mlbench_api.results import (
    CommunicationRecord,
    Environment,
    EpochRecord,
    PhaseTotals,
    RankHardware,
    RunStatus,
    RunSummary,
    StopReason,
)
from mlbench_runner.timing import PHASES, StepTiming
from mlbench_runner.world import World


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index} {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"cpu {cpu} ({torch.get_num_threads()} threads/rank)"


@dataclass(frozen=True)
class ExecutionRecord:
    """Which training step ran and why (the fast path's capture time and check, when it was captured)."""

    path: str
    reason: str
    capture_seconds: float | None = None
    verify_difference: float | None = None
    compiled: bool = False  #: the fast step's model ran through torch.compile


def tf32_label(device: torch.device) -> str | None:
    """Where TensorFloat-32 may be used on this GPU (PyTorch's default: inside cuDNN convolutions only)."""
    if device.type != "cuda":
        return None
    flags = (("cudnn", torch.backends.cudnn.allow_tf32), ("matmul", torch.backends.cuda.matmul.allow_tf32))
    return "+".join(name for name, on in flags if on) or "off"


class SummaryBuilder:
    """Sums step timings and epoch records; ``build`` makes the RunSummary."""

    def __init__(
        self,
        config: RunConfig,
        world: World,
        device: torch.device,
        precision: str,
        execution: ExecutionRecord | None = None,
        *,
        nodes: list[str] | None = None,
        hardware: list[RankHardware] | None = None,
    ) -> None:
        self.config, self.world, self.device, self.precision = config, world, device, precision
        self.execution = execution
        self.nodes = nodes
        self.hardware = hardware
        self.totals = {p: 0.0 for p in PHASES}
        self.evaluation = 0.0
        self.steps_timed = 0
        self.history: list[EpochRecord] = []
        self.time_to_goal: float | None = None
        self.stopped_at: tuple[int, float, float] | None = None
        self.resumes: int | None = None  #: set when the run checkpoints: how often it resumed
        self.parameter_digests: list[str] | None = None  #: each rank's parameter hash at the end (a run that succeeded)
        self.result: RunSummary | None = None

    def add_steps(self, steps: list[StepTiming]) -> None:
        timed = [step for step in steps if step.timed]
        for step in timed:
            for phase, seconds in step.phases.items():
                self.totals[phase] += seconds
        self.steps_timed += len(timed)

    def add_evaluation(self, seconds: float) -> None:
        self.evaluation += seconds

    def add_epoch(
        self, epoch: int, accuracy: float, loss: float, wall: float, lr: float, *, score: float | None = None
    ) -> None:
        """One evaluation: ``score`` is the goal metric's value (the accuracy when not given)."""
        finite_loss = loss if math.isfinite(loss) else None
        score = accuracy if score is None else score
        finite_score = score if math.isfinite(score) else None
        self.history.append(
            EpochRecord(epoch=epoch, accuracy=accuracy, loss=finite_loss, score=finite_score, wall_seconds=wall, lr=lr)
        )

    def throughput(self) -> float:
        """Global samples per second of step time so far."""
        busy = sum(self.totals.values())
        batch = self.config.task.training.batch_size_per_worker
        return self.steps_timed * batch * self.world.size / busy if busy > 0 else 0.0

    def stop(self, steps: int, epochs: float, wall: float) -> None:
        self.stopped_at = (steps, epochs, wall)

    def build(
        self, status: RunStatus, stop_reason: StopReason | None = None, communication: CommunicationRecord | None = None
    ) -> RunSummary:
        steps, epochs, wall = self.stopped_at or (0, 0.0, 0.0)
        t = self.totals
        compute = t["forward"] + t["backward"] + t["compression"] + t["optimizer"]
        comm = t["communication"]
        train_seconds = sum(t.values())
        accuracies = [h.accuracy for h in self.history if h.accuracy is not None]
        goal = self.config.task.goal
        scores = [h.score for h in self.history if h.score is not None]
        batch = self.config.task.training.batch_size_per_worker
        samples = steps * batch * self.world.size
        env = Environment(
            torch=torch.__version__,
            cuda=torch.version.cuda,
            devices=[device_description(self.device)],
            precision=self.precision.split("+")[0],
            channels_last="+channels_last" in self.precision,
            world_size=self.world.size,
            backend=self.config.backend.value,
            algorithm=f"{self.config.algorithm.value}/{self.config.bucketing.value}",
            seed=self.config.seed,
            hostname=os.environ.get("HOSTNAME") or socket.gethostname(),
            nodes=self.nodes,
            hardware=self.hardware,
            training_step=self.execution.path if self.execution else None,
            training_step_reason=self.execution.reason if self.execution else None,
            capture_seconds=self.execution.capture_seconds if self.execution else None,
            compiled=self.execution.compiled if self.execution else None,
            tf32=tf32_label(self.device),
            cudnn_benchmark=torch.backends.cudnn.benchmark if self.device.type == "cuda" else None,
        )
        goal_reached = self.time_to_goal is not None if status != "aborted" else False
        if self.config.task.goal.mode.value == "accuracy-after-time":
            last = self.history[-1].score if self.history else None
            goal_reached = last is not None and goal.met(last, self.config.goal_target) and status != "aborted"
        self.result = RunSummary(
            run=self.config.run_name,
            task=self.config.task_name,
            status=status,
            stop_reason=stop_reason,
            goal_reached=goal_reached,
            goal_target=self.config.goal_target,
            # accuracy-after-time: the first crossing is no score, and a run that ended below the target has none
            time_to_goal_seconds=self.time_to_goal if goal_reached else None,
            best_accuracy=max(accuracies) if accuracies else None,
            final_accuracy=accuracies[-1] if accuracies else None,
            goal_metric=goal.metric.value,
            best_score=better(goal.metric, scores) if scores else None,
            final_score=self.history[-1].score if self.history else None,
            epochs=round(epochs, 6),
            steps=steps,
            samples=samples,
            wall_clock_seconds=wall,
            train_seconds=train_seconds,
            compute_seconds=compute,
            communication_seconds=comm,
            comm_compute_ratio=comm / compute if compute > 0 else None,
            samples_per_second=self.throughput(),  # the timed steps' samples over their time, as the live gauge
            phases=PhaseTotals(evaluation=self.evaluation, **t),
            environment=env,
            communication=communication,
            network=self.config.network.model_dump(by_alias=True, exclude_none=True) if self.config.network else None,
            history=self.history,
            resumes=self.resumes,
            parameter_digests=self.parameter_digests,
        )
        return self.result
