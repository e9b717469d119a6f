"""Run summaries for the tests, made in one place.

- :func:`summary`: a valid :class:`RunSummary` of a finished training run (the goal reached, or not);
  any field can be given instead of its default.
- :func:`collectives_summary`: the summary of a collectives sweep (task 0a), with its table.
- :func:`summary_for`: the summary the runner would write for a ``RunConfig`` (names, world size,
  algorithm and a history that fit it), with the timings given.
- :func:`read_summary`: the ``summary.json`` a run wrote into its output folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlbench_api.config import RunConfig
from mlbench_api.results import CollectiveResult, Environment, EpochRecord, PhaseTotals, RunSummary

#: the task the operator tests admit (tests/operator/helpers.py re-uses it)
TASK_NAME = "optest-task"


def summary(run_name: str = "r1", world_size: int = 2, goal: bool = True, **fields: Any) -> RunSummary:
    """A finished run of ``world_size`` gloo ranks that reached the goal (0.8) at 1234.5 s, or ended below it;
    ``fields`` (RunSummary's Python names) replace the defaults."""
    defaults: dict[str, Any] = {
        "run": run_name,
        "task": TASK_NAME,
        "status": "success" if goal else "goal-not-reached",
        "goal_reached": goal,
        "goal_target": 0.8,
        "time_to_goal_seconds": 1234.5 if goal else None,
        "best_accuracy": 0.81 if goal else 0.5,
        "final_accuracy": 0.81 if goal else 0.5,
        "epochs": 90.0,
        "steps": 1000,
        "samples": 32000,
        "wall_clock_seconds": 1300.0,
        "train_seconds": 1200.0,
        "compute_seconds": 900.0,
        "communication_seconds": 250.0,
        "samples_per_second": 26.7,
        "phases": PhaseTotals(forward=400, backward=500, communication=250),
        "environment": Environment(world_size=world_size, backend="gloo"),
    }
    return RunSummary(**{**defaults, **fields})


def collectives_summary(result: CollectiveResult, **fields: Any) -> RunSummary:
    """A collectives sweep that completed with ``result`` as its table (its peaks in ``peak_bus_bandwidth``)."""
    defaults: dict[str, Any] = {
        "status": "success",
        "stop_reason": "completed",
        "goal_target": None,
        "time_to_goal_seconds": None,
        "best_accuracy": None,
        "final_accuracy": None,
        "epochs": 0,
        "samples": 0,
        "compute_seconds": 0.0,
        "samples_per_second": 0.0,
        "phases": PhaseTotals(communication=fields.get("communication_seconds", 250.0)),
        "environment": Environment(world_size=result.world_size, backend=result.backend, algorithm="collectives"),
        "peak_bus_bandwidth": result.peak_bus_bandwidth(),
        "collectives": result,
    }
    return summary(**{**defaults, **fields})


def summary_for(
    config: RunConfig,
    *,
    ttg: float | None,
    wall: float | None = None,
    compute: tuple[float, float, float] = (2.0, 3.0, 1.0),
    comm: float = 2.0,
    epochs: int = 3,
    device: str = "cpu Test CPU (1 threads/rank)",
) -> RunSummary:
    """A RunSummary as the runner would write for ``config``: reached the goal at ``ttg`` or never."""
    wall = wall if wall is not None else (ttg if ttg is not None else 30.0)
    fwd, bwd, opt = compute
    history = [
        EpochRecord(
            epoch=e,
            accuracy=config.goal_target * (0.6 + 0.4 * e / epochs) if ttg is not None else 0.4 + 0.05 * e,
            loss=1.0 / e,
            wall_seconds=wall * e / epochs,
            lr=0.1,
        )
        for e in range(1, epochs + 1)
    ]
    accuracies = [h.accuracy for h in history if h.accuracy is not None]
    batch = config.task.training.batch_size_per_worker
    return RunSummary(
        run=config.run_name,
        task=config.task_name,
        status="success" if ttg is not None else "goal-not-reached",
        stop_reason="goal" if ttg is not None else "max-epochs",
        goal_reached=ttg is not None,
        goal_target=config.goal_target,
        time_to_goal_seconds=ttg,
        best_accuracy=max(accuracies),
        final_accuracy=accuracies[-1],
        epochs=float(epochs),
        steps=10 * epochs,
        samples=10 * epochs * batch * config.world_size,
        wall_clock_seconds=wall,
        train_seconds=fwd + bwd + opt + comm + 0.5,
        compute_seconds=fwd + bwd + opt,
        communication_seconds=comm,
        comm_compute_ratio=comm / (fwd + bwd + opt),
        samples_per_second=100.0 * config.world_size,
        phases=PhaseTotals(data=0.5, forward=fwd, backward=bwd, communication=comm, optimizer=opt, evaluation=0.3),
        environment=Environment(
            torch="2.15.0",
            devices=[device],
            world_size=config.world_size,
            backend=config.backend.value,
            algorithm=f"{config.algorithm.value}/{config.bucketing.value}",
            seed=config.seed,
            hostname="test-host",
            precision="fp32",
            channels_last=False,
        ),
        history=history,
    )


def read_summary(out: Path) -> RunSummary:
    """The ``summary.json`` in a run's output folder."""
    return RunSummary.model_validate_json((out / "summary.json").read_text())
