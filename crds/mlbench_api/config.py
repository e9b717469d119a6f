"""The effective run configuration: task + allowed overrides + worker-count rules.

The operator renders this into the run's ConfigMap (``config.json``) and the runner
reads it back, so both sides agree on every number. ``mlbench run --local`` builds it the
same way from a BenchmarkRun YAML and the catalog.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError

from mlbench_api.common import ApiModel
from mlbench_api.errors import format_errors
from mlbench_api.run import Algorithm, Backend, BenchmarkRun, Bucketing
from mlbench_api.task import AlphaForWorkers, BenchmarkTaskSpec, Division, Goal, GoalMode, LearningRate, Schedule

CONFIG_ENV = "MLBENCH_RUN_CONFIG"


class OverrideNotAllowed(ValueError):
    """A closed-division run asked to change a hyperparameter the task does not list."""


class InvalidOverride(ValueError):
    """The overrides produce a task that breaks the task's own rules."""


class ResolvedSchedule(ApiModel):
    """The learning-rate rule with every worker-count dependency already applied."""

    schedule: Schedule
    initial_lr: float = Field(description="Rate at step 0 (eta*b for multistep).")
    peak_lr: float = Field(description="Rate after warm-up (eta*b*k with linear scaling).")
    warmup_epochs: int = 0
    milestones: list[int] = Field(default_factory=list)
    decay_factor: float = 0.1
    alpha: float | None = None
    decay_unit: str = "step"


class RunConfig(ApiModel):
    """Everything a rank needs to train, fully resolved."""

    run_name: str
    namespace: str = "default"
    task_name: str
    task: BenchmarkTaskSpec = Field(description="The task snapshot with overrides applied.")
    world_size: Annotated[int, Field(ge=1)]
    workers: Annotated[int, Field(ge=1)]
    slots_per_worker: Annotated[int, Field(ge=1)] = 1
    gpus_per_worker: int = 0
    backend: Backend = Backend.GLOO
    algorithm: Algorithm = Algorithm.ALLREDUCE_SGD
    bucketing: Bucketing = Bucketing.BY_MODEL
    seed: int = 42
    goal_target: float = Field(description="The accuracy to reach (full or light target of the task).")
    time_budget_seconds: int | None = None
    lr: ResolvedSchedule
    output_dir: str = "/tmp/mlbench"
    metrics_port: int = Field(default=9400, description="Base port; rank r serves on base + local rank.")

    def dump(self) -> str:
        return json.dumps(self.to_api(), indent=2)

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        """Read a JSON (or YAML) config file."""
        text = Path(path).read_text()
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            return cls.model_validate(yaml.safe_load(text))
        return cls.model_validate_json(text)


def resolve_schedule(lr: LearningRate, batch: int, world_size: int) -> ResolvedSchedule:
    """Turn a task's learning-rate rule into numbers for this world size."""
    if lr.schedule is Schedule.MULTI_STEP:
        assert lr.per_sample is not None
        initial = lr.per_sample * batch
        peak = initial * world_size if lr.linear_scaling else initial
        if lr.warmup_epochs == 0:
            initial = peak
        return ResolvedSchedule(
            schedule=lr.schedule,
            initial_lr=initial,
            peak_lr=peak,
            warmup_epochs=lr.warmup_epochs,
            milestones=list(lr.milestones),
            decay_factor=lr.decay_factor,
        )
    if lr.schedule is Schedule.INVERSE_SQRT:
        alpha = alpha_for(lr.alpha_by_workers, world_size)
        return ResolvedSchedule(
            schedule=lr.schedule, initial_lr=alpha, peak_lr=alpha, alpha=alpha, decay_unit=lr.decay_unit
        )
    assert lr.value is not None
    return ResolvedSchedule(schedule=lr.schedule, initial_lr=lr.value, peak_lr=lr.value)


def alpha_for(table: list[AlphaForWorkers], world_size: int) -> float:
    """The alpha of the largest ``minWorkers`` row not above the world size."""
    rows = sorted(table, key=lambda r: r.min_workers)
    eligible = [r for r in rows if r.min_workers <= world_size]
    return (eligible[-1] if eligible else rows[0]).alpha


def apply_overrides(task: BenchmarkTaskSpec, run: BenchmarkRun) -> BenchmarkTaskSpec:
    """The task as this run sees it; raises :class:`OverrideNotAllowed` in the closed division."""
    overrides = run.spec.overrides
    if overrides is None:
        return task
    names = overrides.names()
    if task.division is Division.CLOSED:
        allowed = {o.value for o in task.overridable}
        refused = [n for n in names if n not in allowed]
        if refused:
            raise OverrideNotAllowed(
                f"spec.overrides: {', '.join(refused)} may not be overridden in the closed division "
                f"(allowed: {', '.join(sorted(allowed)) or 'none'})"
            )
        source = overrides.dataset_source
        if source is not None and task.dataset.source is not None and source.sha256 != task.dataset.source.sha256:
            raise OverrideNotAllowed(
                "spec.overrides.datasetSource.sha256: the closed division allows only a mirror of the task's "
                f"data (sha256 {task.dataset.source.sha256}), got {source.sha256}"
            )
    data = task.to_api()
    training, lr = data["training"], data["training"]["learningRate"]
    o = overrides
    if o.learning_rate is not None:
        if lr["schedule"] == Schedule.MULTI_STEP.value:
            lr["perSample"] = o.learning_rate
        elif lr["schedule"] == Schedule.INVERSE_SQRT.value:
            lr["alphaByWorkers"] = [{**row, "alpha": o.learning_rate} for row in lr["alphaByWorkers"]]
        else:
            lr["value"] = o.learning_rate
    plain = o.model_dump(mode="json", by_alias=True, exclude_none=True)
    for name in (
        "optimizer",
        "batchSizePerWorker",
        "momentum",
        "nesterov",
        "weightDecay",
        "l2Regularization",
        "maxEpochs",
    ):
        if name in plain:
            training[name] = plain[name]
    if "model" in plain:
        data["model"] = plain["model"]
    if "trainSubset" in plain:
        data["dataset"]["trainSubset"] = plain["trainSubset"]
    if "dataset" in plain:
        data["dataset"]["path"] = plain["dataset"]
    if "datasetSource" in plain:
        data["dataset"]["source"] = plain["datasetSource"]
        data["dataset"].pop("volume", None)  # the source replaces wherever the data came from
    if "timeBudgetSeconds" in plain:
        data["goal"]["timeBudgetSeconds"] = plain["timeBudgetSeconds"]
    # Validate once at the end: an override can break a cross-field rule (maxEpochs below a milestone).
    try:
        return BenchmarkTaskSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidOverride(
            "spec.overrides: the overridden task is invalid: " + "; ".join(format_errors(exc))
        ) from exc


def goal_target(goal: Goal, light: bool) -> float:
    return goal.light_target if light and goal.light_target is not None else goal.target


def effective_config(
    run: BenchmarkRun,
    task_name: str,
    task: BenchmarkTaskSpec,
    *,
    output_dir: str = "/tmp/mlbench",
    metrics_port: int = 9400,
) -> RunConfig:
    """Form the configuration every rank of ``run`` trains with."""
    spec = run.spec
    effective = apply_overrides(task, run)
    world = spec.workers * spec.slots_per_worker
    training = effective.training
    budget = effective.goal.time_budget_seconds if effective.goal.mode is GoalMode.ACCURACY_AFTER_TIME else None
    return RunConfig(
        run_name=run.metadata.name,
        namespace=run.metadata.namespace or "default",
        task_name=task_name,
        task=effective,
        world_size=world,
        workers=spec.workers,
        slots_per_worker=spec.slots_per_worker,
        gpus_per_worker=spec.resources.gpu if spec.resources else 0,
        backend=spec.backend,
        algorithm=spec.algorithm,
        bucketing=spec.bucketing,
        seed=spec.seed,
        goal_target=goal_target(effective.goal, spec.goal.value == "light"),
        time_budget_seconds=budget,
        lr=resolve_schedule(training.learning_rate, training.batch_size_per_worker, world),
        output_dir=output_dir,
        metrics_port=metrics_port,
    )
