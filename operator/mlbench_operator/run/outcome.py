"""A run's outcome: the launcher's summary parsed, the result and the final progress built from it, a failure's
cause found.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from mlbench_api.display import duration, epoch, percent, ratio, score
from mlbench_api.goal import GoalMetric, known_metric
from mlbench_api.results import RunSummary
from mlbench_api.runstatus import Progress, RunResult
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodPhase, PodView


def metric_of(summary: RunSummary) -> GoalMetric | None:
    """The summary's goal metric; None for a summary that names none (older runners: an accuracy, without scores)
    or one this API does not know."""
    return known_metric(summary.goal_metric)


def summary_result(summary: RunSummary, image: str | None = None, workers: Iterable[PodView] = ()) -> RunResult:
    """``status.result``: the summary's figures, and exactly what ran (the image asked for and the digests
    the workers' containers resolved it to, so a result stays attributable after a tag moves)."""
    ids = sorted({p.image_id for p in workers if p.image_id})
    ratio_figure = summary.communication.compression_ratio if summary.communication else None
    return RunResult(
        image=image,
        image_ids=ids[:8] or None,
        goal_reached=summary.goal_reached,
        time_to_goal_seconds=summary.time_to_goal_seconds,
        time_to_goal=duration(summary.time_to_goal_seconds) if summary.time_to_goal_seconds is not None else None,
        best_accuracy=summary.best_accuracy,
        final_accuracy=summary.final_accuracy,
        goal_metric=metric_of(summary),
        best_score=summary.best_score,
        final_score=summary.final_score,
        bleu_signature=summary.bleu_signature,
        epochs=summary.epochs,
        wall_clock_seconds=summary.wall_clock_seconds,
        compute_seconds=summary.compute_seconds,
        communication_seconds=summary.communication_seconds,
        samples_per_second=summary.samples_per_second,
        world_size=summary.environment.world_size,
        resumes=summary.resumes,
        bytes_per_step=summary.communication.bytes_per_step if summary.communication else None,
        compression_ratio=ratio_figure,
        compression=ratio(ratio_figure) if ratio_figure is not None else None,
        peak_bus_bandwidth=summary.peak_bus_bandwidth,
    )


def final_progress(old: Progress | None, summary: RunSummary, now: datetime) -> Progress:
    """``status.progress`` of a finished run: the summary's final figures, not the last scrape.

    Rank 0 is scraped every MLBENCH_PROGRESS_SECONDS, so the last scrape usually predates the
    final evaluation; ``kubectl get br`` must show the epoch and accuracy the run ended with.
    Raises ValueError (a ValidationError) for figures the status cannot hold (e.g. an accuracy above 1).
    """
    data = old.model_dump(by_alias=True, exclude_none=True) if old is not None else {}
    data.update(
        epoch=float(summary.epochs),
        epochRounded=epoch(summary.epochs),
        samplesPerSecond=summary.samples_per_second,
        updatedAt=c.instant(now),
    )
    if summary.final_accuracy is not None:
        data.update(lastAccuracy=summary.final_accuracy, accuracy=percent(summary.final_accuracy))
    metric = metric_of(summary)
    if summary.final_score is not None and metric is not None:
        data.update(lastScore=summary.final_score, score=score(metric, summary.final_score))
    return Progress.model_validate(data)  # an error names the wire's field


def _reject_non_finite(value: str) -> Any:
    raise ValueError(f"the result contains {value}, which is not a number Kubernetes can store")


def _check_finite(data: Any, path: str = "") -> None:
    if isinstance(data, float) and not math.isfinite(data):
        raise ValueError(f"the result's {path or 'value'} is {data}, which is not a number Kubernetes can store")
    if isinstance(data, dict):
        for k, v in data.items():
            _check_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            _check_finite(v, f"{path}[{i}]")


def parse_summary(text: str) -> RunSummary:
    """The launcher's RunSummary; ValueError when malformed or when it holds NaN/Infinity (or overflows
    to it, e.g. ``1e999``): the API server rejects non-finite numbers, which would wedge the status."""
    try:
        data = json.loads(text, parse_constant=_reject_non_finite)
    except json.JSONDecodeError as exc:
        raise ValueError(f"termination message is not JSON: {exc}") from exc
    _check_finite(data)
    return RunSummary.model_validate(data)


def _find_failure(
    run: str, workers: Mapping[int, PodView], launcher: PodView | None, total: int, was_running: bool
) -> tuple[Reason, str] | None:
    """The first real failure of the current world, as (reason, message).

    A failed worker is the root cause and wins over the launcher, whose mpirun fails only as
    its echo (a rank OOM-killed or a worker container killed takes the launcher down too).
    """
    for rank in sorted(workers):
        if workers[rank].phase == PodPhase.FAILED:
            return workers[rank].failure()
    # A worker gone with its node (deleted, evicted by the node controller) takes mpirun down with
    # "ORTE has lost communication": the lost worker is the cause, not the launcher's echo of it.
    lost = [r for r in range(total) if r not in workers or workers[r].terminating]
    if launcher is not None and lost and launcher.phase != PodPhase.SUCCEEDED:
        pod_name = n.worker_name(run, lost[0])
        return Reason.WORKER_LOST, f"worker {lost[0]} (pod {pod_name}) disappeared while the launcher was running"
    if launcher is not None and launcher.phase == PodPhase.FAILED:
        return launcher.failure()
    if was_running and (launcher is None or launcher.terminating):
        return Reason.LAUNCHER_LOST, f"launcher (pod {n.launcher_name(run)}) disappeared while it was running"
    for rank in sorted(workers):
        pod = workers[rank]
        if pod.phase == PodPhase.SUCCEEDED and (launcher is None or not launcher.finished):
            return Reason.WORKER_EXITED, f"worker {rank} (pod {pod.name}) exited before the launcher finished"
    return None


def world_disruption(workers: Mapping[int, PodView], launcher: PodView | None) -> str | None:
    """Why the current world is being taken apart from outside (a pod of it carries DisruptionTarget: a drain,
    an eviction, the taint manager of a lost node, a preemption), or None. Such a restart is not the run's
    failure: it does not count against ``maxRestarts`` (JobSet's RestartJobSetAndIgnoreMaxRestarts)."""
    pods = [workers[rank] for rank in sorted(workers)] + ([launcher] if launcher is not None else [])
    for pod in pods:
        if pod.disrupted:
            what = "launcher" if pod.role == n.ROLE_LAUNCHER else f"worker {pod.rank}"
            return f"{what} (pod {pod.name}) was disrupted ({pod.disrupted})"
    return None


#: Failures a gang restart would only repeat: the run fails at once instead of burning maxRestarts.
PERMANENT_FAILURES = frozenset({Reason.INVALID_INPUT})


#: How long a failed launcher's workers get to report their own cause before the launcher is blamed.
ROOT_CAUSE_GRACE_SECONDS = 10.0


def _root_cause_wait(
    launcher: PodView | None, workers: Mapping[int, PodView], total: int, now: datetime
) -> float | None:
    """Seconds to hold a launcher failure while a still-running worker may report the real cause.

    The launcher and a worker whose rank died fail within a second or two of each other, in
    either order; without this the reported reason would depend on which status arrived first.
    None: decide now (no launcher failure, a worker already failed or is lost, none is running,
    or the grace is over).
    """
    if launcher is None or launcher.phase != PodPhase.FAILED or launcher.finished_at is None:
        return None
    if any(w.phase == PodPhase.FAILED or w.terminating for w in workers.values()) or len(workers) < total:
        return None  # a worker already tells the cause (failed, or lost)
    if not any(w.phase == PodPhase.RUNNING for w in workers.values()):
        return None
    finished = c.parse_time(launcher.finished_at)
    if finished is None:
        return None
    left = ROOT_CAUSE_GRACE_SECONDS - (now - finished).total_seconds()
    return left if left > 0 else None
