"""The effective run configuration: task + allowed overrides + worker-count rules.

The operator renders this into the run's ConfigMap (``config.json``) and the runner
reads it back, so both sides agree on every number. ``mlbench run --local`` builds it the
same way from a BenchmarkRun YAML and the catalog.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import Field, ValidationError

from mlbench_api.common import ApiModel
from mlbench_api.contract import METRICS_PORT, OUTPUT_DIR
from mlbench_api.datasets import reserved_path
from mlbench_api.errors import format_errors
from mlbench_api.goal import Goal, GoalMode
from mlbench_api.model import ModelName
from mlbench_api.network import NetworkConditions
from mlbench_api.parameters import AlgorithmParameters
from mlbench_api.pod import PodSettings, contradictions, merge
from mlbench_api.run import Backend, BenchmarkRun, Bucketing, RunOverrides, host_network_problem
from mlbench_api.schedule import AlphaForWorkers, LearningRate, Schedule
from mlbench_api.task import TRANSLATION_MODELS, BenchmarkTaskSpec, Division
from mlbench_api.training import LANGUAGE_MODEL_ALGORITHMS, TRANSLATION_ALGORITHMS, Algorithm


class OverrideNotAllowed(ValueError):
    """A closed-division run asked to change a hyperparameter the task does not list."""


class AlgorithmNotAllowed(ValueError):
    """A closed-division run asked for an algorithm the task does not list in ``algorithms``."""


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
    warmup_steps: int = Field(
        default=0, description="warmup-inverse-sqrt, exponential-warmup-step-decay: optimizer steps of warm-up."
    )


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
    algorithm_parameters: AlgorithmParameters = Field(
        default_factory=AlgorithmParameters, description="The run's parameters with the algorithm's defaults filled."
    )
    bucketing: Bucketing = Bucketing.BY_MODEL
    network: NetworkConditions | None = None
    seed: int = 42
    # goalTarget and lr exist for training tasks only (a collectives task has no goal and no schedule); the
    # properties goal_target and lr return them typed and raise a ValueError naming the field otherwise.
    goal_target_value: float | None = Field(
        default=None,
        alias="goalTarget",
        description="The accuracy to reach (full or light target of the task); unset for a collectives task.",
    )
    time_budget_seconds: int | None = None
    lr_schedule: ResolvedSchedule | None = Field(
        default=None, alias="lr", description="The resolved learning-rate rule; unset for a collectives task."
    )
    output_dir: str = OUTPUT_DIR
    run_uid: str = Field(
        default="", description="The BenchmarkRun's metadata.uid (empty locally): whose a checkpoint is."
    )
    checkpoint_dir: str | None = Field(
        default=None,
        description="Where rank 0 keeps the run's epoch-end checkpoint and every rank resumes from it; unset: none.",
    )
    metrics_port: int = Field(default=METRICS_PORT, description="Base port; rank r serves on base + local rank.")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """pydantic's model_copy, also taking goal_target and lr in ``update`` (the properties would otherwise hide
        the copied value)."""
        if update:
            names = {"goal_target": "goal_target_value", "lr": "lr_schedule"}
            update = {names.get(k, k): v for k, v in update.items()}
        return super().model_copy(update=update, deep=deep)

    @property
    def goal_target(self) -> float:
        """The accuracy to reach; raises ValueError for a collectives task."""
        if self.goal_target_value is None:
            raise ValueError("goalTarget: a collectives task has no goal")
        return self.goal_target_value

    @property
    def lr(self) -> ResolvedSchedule:
        """The resolved learning-rate rule; raises ValueError for a collectives task."""
        if self.lr_schedule is None:
            raise ValueError("lr: a collectives task has no learning-rate schedule")
        return self.lr_schedule

    def dump(self) -> str:
        return json.dumps(self.to_api(), indent=2)

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        """Read a JSON (or YAML) config file."""
        text = Path(path).read_text()
        if str(path).endswith((".yaml", ".yml")):
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
    if lr.schedule is Schedule.WARMUP_INVERSE_SQRT:
        assert lr.warmup_steps is not None
        return ResolvedSchedule(schedule=lr.schedule, initial_lr=0.0, peak_lr=lr.value, warmup_steps=lr.warmup_steps)
    if lr.schedule is Schedule.EXPONENTIAL_WARMUP_STEP_DECAY:  # the decays depend on the run's length: the loop's
        assert lr.warmup_steps is not None
        assert lr.value is not None
        return ResolvedSchedule(
            schedule=lr.schedule,
            initial_lr=lr.value * 0.01,
            peak_lr=lr.value,
            warmup_steps=lr.warmup_steps,
            decay_factor=lr.decay_factor,
        )
    return ResolvedSchedule(schedule=lr.schedule, initial_lr=lr.value, peak_lr=lr.value)


def alpha_for(table: list[AlphaForWorkers], world_size: int) -> float:
    """The alpha of the largest ``minWorkers`` row not above the world size."""
    rows = sorted(table, key=lambda r: r.min_workers)
    eligible = [r for r in rows if r.min_workers <= world_size]
    return (eligible[-1] if eligible else rows[0]).alpha


def check_algorithm(task: BenchmarkTaskSpec, run: BenchmarkRun) -> None:
    """Raise :class:`AlgorithmNotAllowed` when a closed task does not list the run's algorithm.

    A collectives task trains nothing: it takes the default algorithm only, so that no run claims to have
    measured another one.
    """
    if not task.has_training:
        if run.spec.algorithm is not Algorithm.ALLREDUCE_SGD:
            raise AlgorithmNotAllowed(
                f"spec.algorithm: {run.spec.algorithm.value} means nothing to a collectives task, which times the "
                "backend's collectives and trains no model; leave algorithm unset"
            )
        return
    if task.division is Division.CLOSED and run.spec.algorithm not in task.algorithms:
        raise AlgorithmNotAllowed(
            f"spec.algorithm: {run.spec.algorithm.value} is not allowed by this closed-division task "
            f"(allowed: {', '.join(a.value for a in task.algorithms)}); use an open-division task"
        )


#: Why a closed-division run may not change its task's pod settings.
CLOSED_POD_SETTINGS = (
    "a closed-division task fixes the pod settings it sets (they are part of what it measures, e.g. NCCL_ALGO); "
    "a run may add settings the task leaves unset (its cluster's NCCL_SOCKET_IFNAME, network attachment)"
)


def check_pod(task: BenchmarkTaskSpec, run: BenchmarkRun) -> None:
    """The run's ``spec.pod`` against its task's ``pod``: in the closed division it may not change a setting the
    task sets (:class:`OverrideNotAllowed`, naming the field); the merged settings' hostNetwork needs what the run's
    own does (a ValueError naming the field)."""
    if task.division is Division.CLOSED:
        changed = contradictions(task.pod, run.spec.pod)
        if changed:
            raise OverrideNotAllowed(f"{'; '.join(changed)}: {CLOSED_POD_SETTINGS}")
    merged = merge(task.pod, run.spec.pod)
    if merged is not None and merged is not run.spec.pod:
        try:  # each side is within its bounds; together they may not be (env, annotations: at most so many)
            PodSettings.model_validate(merged.model_dump(by_alias=True, exclude_none=True))
        except ValidationError as exc:
            raise ValueError(f"pod (the task's and the run's together): {'; '.join(format_errors(exc))}") from None
    problem = host_network_problem(run.spec, merged)
    if problem:
        raise ValueError(f"pod.hostNetwork (set by the task's pod): {problem}")


def kind_algorithms(task: BenchmarkTaskSpec) -> tuple[Algorithm, ...] | None:
    """The algorithms the task's kind trains with (translation, language model), or None: every one (the
    image-classification and tabular Trainer runs the whole registry)."""
    model = task.model_spec
    if model is None:
        return None
    if model.name.value in TRANSLATION_MODELS:
        return TRANSLATION_ALGORITHMS
    if model.name is ModelName.AWD_LSTM:
        return LANGUAGE_MODEL_ALGORITHMS
    return None


def check_kind_algorithm(task: BenchmarkTaskSpec, run: BenchmarkRun) -> None:
    """Raise :class:`AlgorithmNotAllowed` when the (effective) task's kind has no loop for the run's algorithm, in
    either division: a rule of the runner, not of the seeds or the page (which close 4a, 4b and 3a to all-reduce
    in the closed division only; the catalog's ``algorithms`` says that)."""
    allowed = kind_algorithms(task)
    if allowed is None or run.spec.algorithm in allowed:
        return
    model = task.model_spec
    assert model is not None
    raise AlgorithmNotAllowed(
        f"spec.algorithm: {run.spec.algorithm.value} has no training loop for a {model.name.value} task "
        f"(this kind runs: {', '.join(a.value for a in allowed)})"
    )


def _check_closed(task: BenchmarkTaskSpec, overrides: RunOverrides, names: list[str]) -> None:
    """A closed-division task's limits on its overrides: only the fields it names, a variant of its model, a
    mirror of its data; raises :class:`OverrideNotAllowed`."""
    allowed = {o.value for o in task.overridable}
    refused = [n for n in names if n not in allowed]
    if refused:
        raise OverrideNotAllowed(
            f"spec.overrides: {', '.join(refused)} may not be overridden in the closed division "
            f"(allowed: {', '.join(sorted(allowed)) or 'none'})"
        )
    model = overrides.model
    if model is not None and task.model_spec is not None and model.name is not task.model_spec.name:
        # an overridable model lets a closed run pick the task's variant (ResNet m1/m2, its depth), not swap it
        raise OverrideNotAllowed(
            f"spec.overrides.model.name: the closed division allows only a variant of the task's "
            f"{task.model_spec.name.value}, got {model.name.value}"
        )
    source = overrides.dataset_source
    if source is not None and task.dataset.source is not None and source.sha256 != task.dataset.source.sha256:
        raise OverrideNotAllowed(
            "spec.overrides.datasetSource.sha256: the closed division allows only a mirror of the task's "
            f"data (sha256 {task.dataset.source.sha256}), got {source.sha256}"
        )


def _override_rate(lr: dict[str, Any], rate: float) -> None:
    """The overridden learning rate in the schedule's own field (``lr``: the API's learningRate, changed)."""
    if lr["schedule"] == Schedule.MULTI_STEP.value:
        lr["perSample"] = rate
    elif lr["schedule"] == Schedule.INVERSE_SQRT.value:
        lr["alphaByWorkers"] = [{**row, "alpha": rate} for row in lr["alphaByWorkers"]]
    else:
        lr["value"] = rate


def _override_budget(goal: dict[str, Any], seconds: float) -> None:
    """The overridden time budget in the API's goal (changed); raises :class:`InvalidOverride` for a goal that
    has none."""
    if goal.get("mode", GoalMode.TIME_TO_ACCURACY.value) != GoalMode.ACCURACY_AFTER_TIME.value:
        # A time-to-accuracy run stops at its target; a budget there would be silently ignored.
        raise InvalidOverride(
            "spec.overrides.timeBudgetSeconds: the task's goal mode is time-to-accuracy, which has no time "
            "budget (only accuracy-after-time tasks use one; bound the run with runPolicy.activeDeadlineSeconds)"
        )
    goal["timeBudgetSeconds"] = seconds


def _check_dataset_path(dataset: Mapping[str, Any], plain: Mapping[str, Any]) -> None:
    """``spec.overrides.dataset`` of a sourced dataset must not name the store or a marker (named as the run's
    field, not as the overridden task's ``dataset.path``)."""
    reserved = reserved_path(plain["dataset"]) if "dataset" in plain and dataset.get("source") else None
    if reserved:
        raise InvalidOverride(f"spec.overrides.dataset: {reserved}")


def apply_overrides(task: BenchmarkTaskSpec, run: BenchmarkRun) -> BenchmarkTaskSpec:
    """The task as this run sees it; raises :class:`OverrideNotAllowed` in the closed division."""
    overrides = run.spec.overrides
    if overrides is None:
        return task
    names = overrides.names()
    if names and not task.has_training:
        raise OverrideNotAllowed(
            f"spec.overrides: {', '.join(names)} cannot be overridden: a collectives task has no model, dataset, "
            "training or goal"
        )
    if task.division is Division.CLOSED:
        _check_closed(task, overrides, names)
    data = task.to_api()
    training, lr = data["training"], data["training"]["learningRate"]
    o = overrides
    if o.learning_rate is not None:
        _override_rate(lr, o.learning_rate)
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
    _check_dataset_path(data["dataset"], plain)
    if "timeBudgetSeconds" in plain:
        _override_budget(data["goal"], plain["timeBudgetSeconds"])
    # Validate once at the end: an override can break a cross-field rule (maxEpochs below a milestone).
    try:
        return BenchmarkTaskSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidOverride(
            "spec.overrides: the overridden task is invalid: " + "; ".join(format_errors(exc))
        ) from exc


def goal_target(goal: Goal, light: bool) -> float:
    return goal.light_target if light and goal.light_target is not None else goal.target


def local_task(task: BenchmarkTaskSpec, run: BenchmarkRun) -> BenchmarkTaskSpec:
    """The task as ``mlbench run --local`` uses it: a local run fetches nothing, so a run that overrides the
    dataset's path (and sets no ``datasetSource``) names where the data already is, and the task's
    ``dataset.source`` (the operator's fetch into ``/data``, which also requires a path under it) is dropped.
    On a cluster the same run is refused (``InvalidConfig``: the path must lie under ``/data/``)."""
    overrides = run.spec.overrides
    if overrides is None or not overrides.dataset or overrides.dataset_source is not None or task.dataset_spec is None:
        return task
    return task.model_copy(update={"dataset_spec": task.dataset_spec.model_copy(update={"source": None})})


def effective_config(
    run: BenchmarkRun,
    task_name: str,
    task: BenchmarkTaskSpec,
    *,
    output_dir: str = OUTPUT_DIR,
    metrics_port: int = METRICS_PORT,
    run_uid: str = "",
    checkpoint_dir: str | None = None,
) -> RunConfig:
    """Form the configuration every rank of ``run`` trains with (or, for a collectives task, times with:
    no goal target, no time budget and no learning-rate schedule)."""
    spec = run.spec
    check_algorithm(task, run)
    check_pod(task, run)
    effective = apply_overrides(task, run)
    check_kind_algorithm(effective, run)
    world = spec.workers * spec.slots_per_worker
    target: float | None = None
    budget: int | None = None
    schedule: ResolvedSchedule | None = None
    if effective.has_training:
        training, goal = effective.training, effective.goal
        target = goal_target(goal, spec.goal.value == "light")
        budget = goal.time_budget_seconds if goal.mode is GoalMode.ACCURACY_AFTER_TIME else None
        schedule = resolve_schedule(training.learning_rate, training.batch_size_per_worker, world)
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
        algorithm_parameters=(spec.algorithm_parameters or AlgorithmParameters()).for_algorithm(spec.algorithm),
        bucketing=spec.bucketing,
        network=spec.network,
        seed=spec.seed,
        goal_target_value=target,
        time_budget_seconds=budget,
        lr_schedule=schedule,
        output_dir=output_dir,
        metrics_port=metrics_port,
        run_uid=run_uid,
        checkpoint_dir=checkpoint_dir,
    )
