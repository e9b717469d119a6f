"""What the task kinds that train on tokens (translation, language modelling) share around their loops: a rank's
start (device, output folder, event log, metrics), its rank record, and rank 0's RunSummary (how the run stopped,
the goal metric per epoch, target tokens as the samples, compute and communication seconds of the steps).

Each kind's loop returns its own result (BLEU's signature and the loss scaler's skipped steps for translation,
NT-ASGD's averaging for language modelling); what they share is read through :class:`TokenResult`, and a kind's
own fields reach the summary as keyword arguments of :func:`summary_of`.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from mlbench_api import atomic
from mlbench_api.config import RunConfig
from mlbench_api.goal import GoalMode, better
from mlbench_api.results import Environment, EpochRecord, PhaseTotals, RunStatus, RunSummary, StopReason
from mlbench_api.training import Algorithm
from mlbench_runner.events import EventLog
from mlbench_runner.metrics import RunnerMetrics
from mlbench_runner.world import World


class EpochScore(Protocol):
    @property
    def epoch(self) -> int: ...
    @property
    def score(self) -> float: ...
    @property
    def loss(self) -> float: ...
    @property
    def wall_seconds(self) -> float: ...


class TokenResult(Protocol):
    @property
    def history(self) -> Sequence[EpochScore]: ...
    @property
    def time_to_goal(self) -> float | None: ...
    @property
    def reached(self) -> bool: ...
    @property
    def steps(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def compute_seconds(self) -> float: ...
    @property
    def communication_seconds(self) -> float: ...


def stop_of(config: RunConfig, result: TokenResult) -> tuple[RunStatus, StopReason]:
    """How the run ended: the goal met, or not by the last epoch or by the time budget."""
    if config.task.goal.mode is GoalMode.ACCURACY_AFTER_TIME:
        last = result.history[-1].wall_seconds if result.history else 0.0
        budget = config.task.goal.time_budget_seconds or math.inf
        return ("success" if result.reached else "goal-not-reached"), (
            "time-budget" if last >= budget else "max-epochs"
        )
    return ("success", "goal") if result.reached else ("goal-not-reached", "max-epochs")


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def summary_of(
    config: RunConfig,
    world: World,
    device: torch.device,
    result: TokenResult,
    wall: float,
    *,
    precision: str = "fp32",
    **kind_fields: Any,
) -> RunSummary:
    """Rank 0's RunSummary (``kind_fields``: the RunSummary fields only one kind has)."""
    status, reason = stop_of(config, result)
    scores = [h.score for h in result.history if math.isfinite(h.score)]
    busy = result.compute_seconds + result.communication_seconds
    comm = result.communication_seconds
    return RunSummary(
        run=config.run_name,
        task=config.task_name,
        status=status,
        stop_reason=reason,
        goal_reached=result.reached,
        goal_target=config.goal_target,
        time_to_goal_seconds=result.time_to_goal if result.reached else None,
        goal_metric=config.task.goal.metric.value,
        best_score=better(config.task.goal.metric, scores) if scores else None,
        final_score=scores[-1] if scores else None,
        epochs=float(len(result.history)),
        steps=result.steps,
        samples=result.tokens,
        wall_clock_seconds=wall,
        train_seconds=busy,
        compute_seconds=result.compute_seconds,
        communication_seconds=comm,
        comm_compute_ratio=comm / result.compute_seconds if result.compute_seconds else None,
        samples_per_second=result.tokens / busy if busy > 0 else 0.0,
        phases=PhaseTotals(communication=comm),
        environment=Environment(
            torch=torch.__version__,
            cuda=torch.version.cuda,
            devices=[str(device)],
            world_size=world.size,
            backend=config.backend.value,
            algorithm=config.algorithm.value,
            seed=config.seed,
            hostname=os.environ.get("HOSTNAME") or socket.gethostname(),
            precision=precision,
        ),
        history=[
            EpochRecord(epoch=h.epoch, loss=_finite(h.loss), score=_finite(h.score), wall_seconds=h.wall_seconds)
            for h in result.history
        ],
        **kind_fields,
    )


@dataclass(frozen=True)
class RankStart:
    """A rank of a token task, started: where it runs and writes, and what it reports through."""

    device: torch.device
    out: Path
    log: EventLog
    metrics: RunnerMetrics


def start_rank(
    config: RunConfig, world: World, kind: str, algorithms: Sequence[Algorithm] = (Algorithm.ALLREDUCE_SGD,)
) -> RankStart:
    """Refuse any algorithm but ``algorithms`` (``kind`` names the task kind in the message; admission refuses them
    first: ``mlbench_api.config.check_kind_algorithm``), pick the device, make the output folder, open the event
    log, serve the metrics and log ``run_start``."""
    if config.algorithm not in algorithms:
        runs = ", ".join(a.value for a in algorithms)
        raise ValueError(f"algorithm: {kind} task runs {runs} only, not {config.algorithm.value}")
    use_gpu = config.backend.value == "nccl" or (config.gpus_per_worker > 0 and torch.cuda.is_available())
    device = torch.device("cuda", world.local_rank % torch.cuda.device_count()) if use_gpu else torch.device("cpu")
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = EventLog(world.rank, out)
    metrics = RunnerMetrics(
        config.run_name,
        config.task_name,
        config.backend.value,
        world_size=world.size,
        algorithm=config.algorithm.value,
        rank=world.rank,
    )
    metrics.serve(config.metrics_port + world.local_rank if config.metrics_port else 0)
    log.event("run_start", run=config.run_name, task=config.task_name, rank_count=world.size, device=str(device))
    return RankStart(device, out, log, metrics)


def record_rank(config: RunConfig, world: World, out: Path, result: TokenResult) -> None:
    """This rank's record (``ranks/rank-<r>.json``, as the Trainer's RankRecord)."""
    _status, reason = stop_of(config, result)
    record = {"rank": world.rank, "steps": result.steps, "stop_reason": reason, "epochs_completed": len(result.history)}
    (out / "ranks").mkdir(exist_ok=True)
    (out / "ranks" / f"rank-{world.rank}.json").write_text(json.dumps(record))


def finish(start: RankStart, summary: RunSummary) -> RunSummary:
    """Rank 0: write ``summary.json``, log ``run_stop`` and ``run_summary``, close the log."""
    atomic.write_text(start.out / "summary.json", summary.model_dump_json(by_alias=True, indent=2))
    start.log.event(
        "run_stop", status=summary.status, stop_reason=summary.stop_reason, goal_reached=summary.goal_reached
    )
    start.log.event("run_summary", summary=json.loads(summary.termination_message()))
    start.log.close()
    return summary
