"""Scores of several runs, per configuration: what ``mlbench results`` prints (docs/results.md).

Pure functions on values already read (no files, no printing), so each rule is tested on
hand-computed inputs (tests/runner/test_scoring.py).

* **Configuration**: everything a run was started with except its seed (and its name, namespace,
  output folder and metrics port): the task as the run saw it (overrides applied, so two runs with
  different overrides differ), division, world size = workers x slots, backend, algorithm,
  bucketing, goal target, precision and the device rank 0 trained on. Where the data was read
  from (dataset path, volume, source URL) is not part of it: a mirror is the same data.
* **Time to goal**: MLPerf Training's olympic mean (training_rules.adoc, "Benchmark Results"):
  drop the fastest and the slowest run, average the rest; "a single non-converging run may be
  treated as the slowest run and dropped. A benchmark result is invalid if there is more than one
  non-converging run." With fewer than :data:`OLYMPIC_MIN_SUCCESSES` successful runs there is
  nothing left to average once the extremes are dropped: the plain mean, flagged.
* **Seeds needed**: MLPerf fixes the number of runs per benchmark; image classification (ResNet-50,
  the benchmark task 1a follows) needed :data:`RUNS_REQUIRED` (5), recommendation and NLP 10,
  LLM pre-training 3. MLBench asks 5 seeds per configuration for every task and flags fewer.
* **Speedup**: time to goal of the configuration with the smallest world size of the same family
  (same task, settings, backend, algorithm, bucketing; only workers/slots differ) divided by
  this configuration's; efficiency = speedup / (world size / baseline world size).
* **Cost** (MLBench's cost chart): workers x hours x price per worker-hour, for the mean wall
  clock of a run and for the time to goal.
* **Communication/computation split**: rank 0's phase totals; compute = forward + backward +
  compression + optimizer, communication = the communication phase, other = the rest of the wall clock (data
  loading, evaluation, set-up).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from mlbench_api.config import RunConfig
from mlbench_api.goal import GoalMode
from mlbench_api.hardware import hardware_label
from mlbench_api.results import RunSummary

#: Runs (seeds) per configuration: MLPerf Training's count for image classification.
RUNS_REQUIRED = 5
#: Successful runs the olympic mean needs: one left after dropping the fastest and the slowest.
OLYMPIC_MIN_SUCCESSES = 3

#: Parts of the effective task that say where the data lives, not what it is.
_LOCATION = {"description", "overridable", "dataset.path", "dataset.volume", "dataset.source.url"}


@dataclass(frozen=True)
class TimeToGoal:
    """A configuration's time to goal over its seeds, and how it was computed."""

    value: float | None
    method: Literal["olympic", "mean", "none"]
    used: tuple[float, ...] = ()
    """The times averaged."""
    dropped: tuple[float, ...] = ()
    """Successful runs' times left out (the fastest, and the slowest unless a failed run took its place)."""
    failure_dropped: bool = False
    """A run that missed the goal was dropped as the slowest (MLPerf allows one)."""
    flags: tuple[str, ...] = ()


def olympic_mean(times: Sequence[float], failures: int = 0) -> TimeToGoal:
    """MLPerf's olympic mean of the successful runs' ``times``; ``failures`` runs missed the goal.

    The failed runs count as infinitely slow: with none, the fastest and the slowest time are
    dropped; with one, the fastest time and the failure; with more the result is invalid under
    MLPerf's rule, and the value is the olympic mean of the successful runs, flagged. Ties drop
    one run each (``[10, 10, 20, 30, 30]`` -> 20). Fewer than 3 successes: the plain mean, flagged.
    """
    if failures < 0:
        raise ValueError("failures must be >= 0")
    ts = sorted(times)
    if not ts:
        return TimeToGoal(None, "none", flags=("no run reached the goal",))
    if len(ts) < OLYMPIC_MIN_SUCCESSES:
        flag = (
            f"only {len(ts)} successful run{'s' if len(ts) > 1 else ''}: plain mean, not the olympic mean "
            f"(needs >= {OLYMPIC_MIN_SUCCESSES})"
        )
        return TimeToGoal(statistics.fmean(ts), "mean", tuple(ts), flags=(flag,))
    if failures == 1:
        used = tuple(ts[1:])
        return TimeToGoal(statistics.fmean(used), "olympic", used, (ts[0],), failure_dropped=True)
    used = tuple(ts[1:-1])
    flags: tuple[str, ...] = ()
    if failures > 1:
        flags = (
            f"{failures} runs missed the goal: invalid under MLPerf (at most 1); olympic mean of the successful runs",
        )
    return TimeToGoal(statistics.fmean(used), "olympic", used, (ts[0], ts[-1]), flags=flags)


@dataclass(frozen=True)
class Spread:
    """Of the successful runs' times to goal."""

    min: float
    max: float
    stdev: float | None
    """Sample standard deviation (n - 1); None for a single run."""


def spread(times: Sequence[float]) -> Spread | None:
    if not times:
        return None
    return Spread(min(times), max(times), statistics.stdev(times) if len(times) > 1 else None)


def success_rate(reached: int, runs: int) -> float | None:
    """Runs that reached the goal / runs."""
    return reached / runs if runs else None


def speedup(baseline_seconds: float | None, seconds: float | None) -> float | None:
    """How many times faster than the baseline (time-to-goal ratio)."""
    if baseline_seconds is None or seconds is None or seconds <= 0:
        return None
    return baseline_seconds / seconds


def scaling_efficiency(ratio: float | None, baseline_world_size: int, world_size: int) -> float | None:
    """Speedup per added rank: 1.0 is linear scaling."""
    if ratio is None or baseline_world_size <= 0:
        return None
    return ratio / (world_size / baseline_world_size)


def cost(workers: int, seconds: float | None, price_per_worker_hour: float | None) -> float | None:
    """workers x wall-clock hours x price per worker-hour."""
    if seconds is None or price_per_worker_hour is None:
        return None
    return workers * seconds / 3600.0 * price_per_worker_hour


@dataclass(frozen=True)
class PhaseSplit:
    """Seconds of rank 0: compute (forward, backward, optimizer), communication, and the rest of the wall clock."""

    compute: float
    communication: float
    other: float

    @property
    def communication_share(self) -> float | None:
        """communication / (compute + communication)."""
        busy = self.compute + self.communication
        return self.communication / busy if busy > 0 else None


def phase_split(summary: RunSummary) -> PhaseSplit:
    ph = summary.phases
    compute = ph.forward + ph.backward + ph.compression + ph.optimizer
    other = max(0.0, summary.wall_clock_seconds - compute - ph.communication)
    return PhaseSplit(compute, ph.communication, other)


def mean_split(splits: Sequence[PhaseSplit]) -> PhaseSplit:
    if not splits:
        return PhaseSplit(0.0, 0.0, 0.0)
    return PhaseSplit(
        statistics.fmean(s.compute for s in splits),
        statistics.fmean(s.communication for s in splits),
        statistics.fmean(s.other for s in splits),
    )


@dataclass(frozen=True)
class Configuration:
    """What a run was started with, except its seed: runs with equal configurations are seeds of one result."""

    task: str
    world_size: int
    workers: int
    slots_per_worker: int
    backend: str
    algorithm: str
    bucketing: str
    division: str
    """closed, open, or unknown (no config.json)."""
    settings: tuple[tuple[str, str], ...] = ()
    """Everything else that must match, as sorted (dotted name, value) pairs."""

    def family(self) -> Configuration:
        """The configuration with the world size left out: what a speedup compares across."""
        return replace(self, world_size=0, workers=0, slots_per_worker=0)

    def label(self) -> str:
        return f"{self.task} {self.workers}x{self.slots_per_worker} {self.backend} {self.algorithm}/{self.bucketing}"

    def sort_key(self) -> tuple[Any, ...]:
        f = self.family()
        return (f.task, f.division, f.backend, f.algorithm, f.bucketing, f.settings, self.world_size, self.workers)


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        out: list[tuple[str, str]] = []
        for k, v in value.items():
            out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, str(value))]


def device_of(summary: RunSummary) -> str:
    """Rank 0's device without its index or thread count, which follow from the world size on one machine
    (``cuda:3 NVIDIA H100`` -> ``cuda NVIDIA H100``, ``cpu Xeon (2 threads/rank)`` -> ``cpu Xeon``)."""
    devices = summary.environment.devices
    if not devices:
        return "unknown"
    return re.sub(r" \(\d+ threads/rank\)$", "", re.sub(r"^(\w+):\d+ ", r"\1 ", devices[0]))


def configuration(summary: RunSummary, config: RunConfig | None) -> Configuration:
    """A run's configuration: from its ``config.json`` when there is one, else from the summary alone."""
    env = summary.environment
    common = [
        ("goalTarget", str(summary.goal_target)),
        ("precision", str(env.precision)),
        ("channelsLast", str(env.channels_last)),
        ("device", device_of(summary)),
        ("hardware", hardware_label(summary)),  # instance type, zone, GPU, driver, CUDA: two clusters never mix
    ]
    if config is None:
        algorithm, _, bucketing = (env.algorithm or "unknown").partition("/")
        return Configuration(
            task=summary.task,
            world_size=env.world_size,
            workers=env.world_size,
            slots_per_worker=1,
            backend=env.backend,
            algorithm=algorithm,
            bucketing=bucketing or "unknown",
            division="unknown",
            settings=tuple(sorted(common)),
        )
    return _from_config(config, common)


def _from_config(config: RunConfig, common: Sequence[tuple[str, str]] = ()) -> Configuration:
    """The configuration ``config.json`` says, with ``common`` (what only the summary knows) added."""
    task = [(k, v) for k, v in _flatten(config.task.to_api()) if not any(_within(k, loc) for loc in _LOCATION)]
    extra = [
        ("goalTarget", str(config.goal_target)),
        ("timeBudgetSeconds", str(config.time_budget_seconds)),
        ("gpusPerWorker", str(config.gpus_per_worker)),
    ]
    settings = dict(common) | dict(extra) | {f"task.{k}": v for k, v in task}
    return Configuration(
        task=config.task_name,
        world_size=config.world_size,
        workers=config.workers,
        slots_per_worker=config.slots_per_worker,
        backend=config.backend.value,
        algorithm=algorithm_label(config),
        bucketing=config.bucketing.value,
        division=config.task.division.value,
        settings=tuple(sorted(settings.items())),
    )


def algorithm_label(config: RunConfig) -> str:
    """The algorithm with its parameters (``powersgd[rank=2,warmStart=True]``): runs with other parameters
    are other configurations. Emulated network conditions are part of it too."""
    params = config.algorithm_parameters.to_api()
    label = config.algorithm.value + (f"[{','.join(f'{k}={v}' for k, v in sorted(params.items()))}]" if params else "")
    if config.network is not None:
        shaped = config.network.to_api()
        label += f"@net[{','.join(f'{k}={v}' for k, v in sorted(shaped.items()))}]"
    return label


def _within(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


@dataclass(frozen=True)
class RunResult:
    """What scoring needs of one run."""

    name: str
    configuration: Configuration
    seed: int | None
    status: str
    reached: bool
    """Reached the goal, with a time to goal."""
    time_to_goal: float | None
    wall_clock: float
    best_accuracy: float | None
    samples_per_second: float
    split: PhaseSplit
    source: str = ""
    """Where it was read from (a result directory)."""
    bytes_per_step: int | None = None
    """Payload bytes per rank per step the algorithm declared."""
    compression_ratio: float | None = None
    measured: bool = True
    """False for a run that left no readable summary: it counts as a run, but has no times to average."""
    final_accuracy: float | None = None
    """The last evaluation's accuracy: an accuracy-after-time goal's score."""
    accuracy_after_time: bool = False
    """The task's goal is accuracy-after-time (its ``config.json`` says; without one: time-to-accuracy)."""


#: The status of a run that left no readable summary.
NO_SUMMARY = "no-summary"


def unfinished_result(config: RunConfig, source: str = "") -> RunResult:
    """A run that left its ``config.json`` but no readable summary (it crashed, or was interrupted).

    It is a run that did not reach the goal, as MLPerf counts a non-converging run: leaving it out
    would raise the success rate and skip the rule that allows one such run per result. Nothing of it
    was measured, so it adds nothing to the means of time, throughput or phases.
    """
    return RunResult(
        name=config.run_name,
        configuration=_from_config(config),
        seed=config.seed,
        status=NO_SUMMARY,
        reached=False,
        time_to_goal=None,
        wall_clock=0.0,
        best_accuracy=None,
        samples_per_second=0.0,
        split=PhaseSplit(0.0, 0.0, 0.0),
        source=source,
        measured=False,
        accuracy_after_time=config.task.goal.mode is GoalMode.ACCURACY_AFTER_TIME,
    )


def _agrees(unfinished: Configuration, finished: Configuration) -> bool:
    """Whether a run without a summary was started as ``finished`` was: everything its config says is equal."""
    if replace(unfinished, settings=()) != replace(finished, settings=()):
        return False
    known = dict(finished.settings)
    return all(known.get(k) == v for k, v in unfinished.settings)


def attach_unfinished(runs: Sequence[RunResult]) -> list[RunResult]:
    """Each run without a summary joined to the one configuration of the measured runs it was started as.

    Its own configuration lacks what only a summary says (precision, device): where exactly one
    measured configuration agrees with everything else, it is that configuration's failed seed. Where
    none does but exactly one measured family (world size left out) agrees, it joins that family at its
    own world size: every seed of that size failed, and the family's speedups must still count from its
    smallest world, flagged as a baseline that never reached the goal, not from the next one. Where
    several do (e.g. the same run on two devices), it stays a configuration of its own.
    """
    finished = list(dict.fromkeys(r.configuration for r in runs if r.measured))
    families = list(dict.fromkeys(c.family() for c in finished))
    out = []
    for r in runs:
        own = r.configuration
        matches = [] if r.measured else [c for c in finished if _agrees(own, c)]
        if not r.measured and not matches:
            matches = [
                replace(f, world_size=own.world_size, workers=own.workers, slots_per_worker=own.slots_per_worker)
                for f in families
                if _agrees(own.family(), f)
            ]
        out.append(replace(r, configuration=matches[0]) if len(matches) == 1 else r)
    return out


def run_result(summary: RunSummary, config: RunConfig | None, source: str = "") -> RunResult:
    reached = summary.goal_reached and summary.time_to_goal_seconds is not None
    return RunResult(
        name=summary.run,
        configuration=configuration(summary, config),
        seed=config.seed if config is not None else summary.environment.seed,
        status=summary.status,
        reached=reached,
        time_to_goal=summary.time_to_goal_seconds if reached else None,
        wall_clock=summary.wall_clock_seconds,
        best_accuracy=summary.best_accuracy,
        samples_per_second=summary.samples_per_second,
        split=phase_split(summary),
        source=source,
        bytes_per_step=summary.communication.bytes_per_step if summary.communication else None,
        compression_ratio=summary.communication.compression_ratio if summary.communication else None,
        final_accuracy=summary.final_accuracy,
        accuracy_after_time=config is not None and config.task.goal.mode is GoalMode.ACCURACY_AFTER_TIME,
    )


@dataclass(frozen=True)
class ConfigScore:
    """One configuration's result over its runs."""

    configuration: Configuration
    runs: tuple[RunResult, ...]
    time_to_goal: TimeToGoal
    spread: Spread | None
    success_rate: float | None
    wall_clock: float | None
    """Mean over the runs that left a summary (None: none did)."""
    best_accuracy: float | None
    """Mean over the runs that evaluated."""
    final_accuracy: float | None
    """Mean of the runs' last evaluations: the score of an accuracy-after-time goal (higher is better)."""
    samples_per_second: float
    split: PhaseSplit
    """Mean over the runs that left a summary."""
    speedup: float | None = None
    efficiency: float | None = None
    baseline_world_size: int | None = None
    cost_per_run: float | None = None
    cost_to_goal: float | None = None
    variant: str = ""
    """The settings in which this configuration differs from others of its task in the same report."""
    flags: tuple[str, ...] = field(default=())

    @property
    def reached(self) -> int:
        return sum(r.reached for r in self.runs)

    @property
    def accuracy_after_time(self) -> bool:
        """Its goal is accuracy-after-time: scored by ``final_accuracy``, not by time."""
        return self.runs[0].accuracy_after_time

    @property
    def bytes_per_step(self) -> int | None:
        """The algorithm's declared payload per rank per step (the same for every seed)."""
        return next((r.bytes_per_step for r in self.runs if r.bytes_per_step is not None), None)

    @property
    def compression_ratio(self) -> float | None:
        return next((r.compression_ratio for r in self.runs if r.compression_ratio is not None), None)


def score_configuration(runs: Sequence[RunResult], runs_required: int = RUNS_REQUIRED) -> ConfigScore:
    """Olympic mean, spread, success rate and means of one configuration's runs (speedup and cost: :func:`score`)."""
    if not runs:
        raise ValueError("a configuration needs at least one run")
    times = [r.time_to_goal for r in runs if r.reached and r.time_to_goal is not None]
    after_time = runs[0].accuracy_after_time
    ttg = TimeToGoal(None, "none") if after_time else olympic_mean(times, failures=len(runs) - len(times))
    flags = list(ttg.flags)
    if after_time:
        flags.append("accuracy-after-time goal: scored by the final model's accuracy (mean over the runs), not by time")
    if len(runs) < runs_required:
        flags.append(f"{len(runs)} run{'s' if len(runs) > 1 else ''}; MLPerf-style scoring wants {runs_required} seeds")
    repeated = sorted(s for s, n in Counter(r.seed for r in runs if r.seed is not None).items() if n > 1)
    if repeated:
        flags.append(f"seed {', '.join(map(str, repeated))} used more than once (MLPerf: seeds must not repeat)")
    unfinished = [r.name for r in runs if not r.measured]
    if unfinished:
        flags.append(
            f"{len(unfinished)} run(s) left no readable summary, counted as missing the goal: " + ", ".join(unfinished)
        )
    accuracies = [r.best_accuracy for r in runs if r.best_accuracy is not None]
    finals = [r.final_accuracy for r in runs if r.final_accuracy is not None]
    measured = [r for r in runs if r.measured]
    return ConfigScore(
        configuration=runs[0].configuration,
        runs=tuple(runs),
        time_to_goal=ttg,
        spread=None if after_time else spread(times),
        success_rate=success_rate(len(times), len(runs)),
        wall_clock=statistics.fmean(r.wall_clock for r in measured) if measured else None,
        best_accuracy=statistics.fmean(accuracies) if accuracies else None,
        final_accuracy=statistics.fmean(finals) if finals else None,
        samples_per_second=statistics.fmean(r.samples_per_second for r in measured) if measured else 0.0,
        split=mean_split([r.split for r in measured]),
        flags=tuple(flags),
    )


def group(runs: Iterable[RunResult]) -> list[list[RunResult]]:
    """Runs by configuration, configurations sorted by task, family and world size."""
    groups: dict[Configuration, list[RunResult]] = {}
    for r in runs:
        groups.setdefault(r.configuration, []).append(r)
    return [groups[c] for c in sorted(groups, key=Configuration.sort_key)]


def variant_labels(configurations: Sequence[Configuration]) -> dict[Configuration, str]:
    """For each configuration, its settings that differ among the configurations of the same task."""
    by_task: dict[str, list[Configuration]] = {}
    for c in configurations:
        by_task.setdefault(c.task, []).append(c)
    labels: dict[Configuration, str] = {}
    for configs in by_task.values():
        maps = [dict(c.settings) for c in configs]
        # Settings some runs lack (no config.json) are not a difference to show: the division says it.
        keys = sorted(set.intersection(*(set(m) for m in maps)))
        varying = [k for k in keys if len({m[k] for m in maps}) > 1]
        for c, m in zip(configs, maps, strict=True):
            labels[c] = ", ".join(f"{k.rsplit('.', 1)[-1]}={m[k]}" for k in varying)
    return labels


def score(
    runs: Iterable[RunResult],
    price_per_worker_hour: float | None = None,
    runs_required: int = RUNS_REQUIRED,
) -> list[ConfigScore]:
    """Every configuration's score: olympic mean over seeds, spread, success rate, speedup, cost, split."""
    scores = [score_configuration(g, runs_required) for g in group(attach_unfinished(list(runs)))]
    labels = variant_labels([s.configuration for s in scores])
    baselines: dict[Configuration, ConfigScore] = {}
    for s in scores:  # sorted by world size within a family: the first is the smallest
        baselines.setdefault(s.configuration.family(), s)
    out = []
    for s in scores:
        c = s.configuration
        base = baselines[c.family()]
        flags = list(s.flags)
        ratio = speedup(base.time_to_goal.value, s.time_to_goal.value)
        if base is not s and base.time_to_goal.value is None and not s.accuracy_after_time:
            flags.append(f"no speedup: the baseline ({base.configuration.world_size} ranks) never reached the goal")
        out.append(
            replace(
                s,
                speedup=ratio,
                efficiency=scaling_efficiency(ratio, base.configuration.world_size, c.world_size),
                baseline_world_size=base.configuration.world_size,
                cost_per_run=cost(c.workers, s.wall_clock, price_per_worker_hour),
                cost_to_goal=cost(c.workers, s.time_to_goal.value, price_per_worker_hour),
                variant=labels[c],
                flags=tuple(flags),
            )
        )
    return out
