"""The report's tables, as text, markdown, JSON and CSV: one row per run (:func:`format_table`) and one per
configuration (:func:`format_scores`, :func:`format_markdown`, :func:`score_dict`, :func:`format_csv`). Pure
formatting of values already read and scored (:mod:`mlbench_runner.tools.scoring`); ``mlbench results`` is
:mod:`mlbench_runner.tools.report`."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from mlbench_api.goal import GoalMode
from mlbench_api.results import RunSummary
from mlbench_runner.tools import plots
from mlbench_runner.tools.runs import LoadedRun, Unfinished
from mlbench_runner.tools.scoring import RUNS_REQUIRED, ConfigScore

COLUMNS = (
    "run",
    "task",
    "ranks",
    "backend",
    "seed",
    "status",
    "best acc",
    "target",
    "time to goal",
    "wall",
    "samples/s",
    "comm/compute",
    "bytes/step",
    "compression",
)

Column = tuple[str, Callable[[ConfigScore], str]]


#: A number's format by the kind of its column (``bytes``: :func:`_bytes`; any other kind: one decimal).
FORMATS: dict[str, Callable[[float], str]] = {
    "pct": lambda v: f"{100 * v:.2f}%",
    "pct1": lambda v: f"{100 * v:.1f}%",
    "s": lambda v: f"{v:.1f}s",
    "ratio": lambda v: f"{v:.3f}",
    "x": lambda v: f"{v:.2f}x",
    "money": lambda v: f"{v:.4g}",
}


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "bytes":
        return _bytes(value)
    return FORMATS.get(kind, lambda v: f"{v:.1f}")(value)


def _bytes(value: float) -> str:
    """Binary units, three significant figures: 1.07 MiB, 4 B."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(out)


def _markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cell(v: str) -> str:
        return v.replace("|", "\\|")

    out = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    return "\n".join(out)


# -- per run -------------------------------------------------------------------------------------


def _accuracy_goal(s: RunSummary) -> bool:
    """Whether the run's goal is an accuracy (older summaries name no metric: theirs was)."""
    return s.goal_metric is None or s.goal_metric.endswith("accuracy")


def _score(value: float | None, metric: str | None) -> str:
    """A BLEU, perplexity or loss value with its metric's name: ``66.24 bleu``."""
    return "-" if value is None else f"{value:.2f} {metric}"


def _run_rows(summaries: Sequence[RunSummary]) -> list[tuple[str, ...]]:
    return [
        (
            s.run,
            s.task,
            str(s.environment.world_size),
            s.environment.backend,
            str(s.environment.seed) if s.environment.seed is not None else "-",
            s.status,
            _fmt(s.best_accuracy, "pct") if _accuracy_goal(s) else _score(s.best_score, s.goal_metric),
            _fmt(s.goal_target, "pct") if _accuracy_goal(s) else _score(s.goal_target, s.goal_metric),
            _fmt(s.time_to_goal_seconds, "s"),
            _fmt(s.wall_clock_seconds, "s"),
            _fmt(s.samples_per_second, "n"),
            _fmt(s.comm_compute_ratio, "ratio"),
            _fmt(s.communication.bytes_per_step if s.communication else None, "bytes"),
            _fmt(s.communication.compression_ratio if s.communication else None, "x"),
        )
        for s in summaries
    ]


def format_table(summaries: list[RunSummary]) -> str:
    """A fixed-width text table, one row per run."""
    return _text_table(COLUMNS, _run_rows(summaries))


# -- per configuration ---------------------------------------------------------------------------


def _method(s: ConfigScore) -> str:
    t = s.time_to_goal
    if t.method == "none":
        return "-"
    return f"{t.method} of {len(t.used)}/{len(s.runs)}"


def _config_columns(scores: Sequence[ConfigScore], price: float | None) -> list[Column]:
    cols: list[Column] = [
        ("configuration", lambda s: s.configuration.label()),
        ("division", lambda s: s.configuration.division),
    ]
    if any(s.variant for s in scores):
        cols.append(("variant", lambda s: s.variant or "-"))
    cols += [
        ("runs", lambda s: str(len(s.runs))),
        ("success", lambda s: f"{s.reached}/{len(s.runs)}"),
        ("time to goal", lambda s: _fmt(s.time_to_goal.value, "s") + ("*" if s.flags else "")),
        ("scored as", _method),
    ]
    if any(s.accuracy_after_time for s in scores):  # that goal's score (docs/results.md)
        cols.append(("final acc", lambda s: _fmt(s.final_accuracy, "pct") if s.accuracy_after_time else "-"))
    cols += [
        ("min", lambda s: _fmt(s.spread.min if s.spread else None, "s")),
        ("max", lambda s: _fmt(s.spread.max if s.spread else None, "s")),
        ("stdev", lambda s: _fmt(s.spread.stdev if s.spread else None, "s")),
        ("speedup", lambda s: _fmt(s.speedup, "x")),
        ("efficiency", lambda s: _fmt(s.efficiency, "pct1")),
        ("comm share", lambda s: _fmt(s.split.communication_share, "pct1")),
        ("bytes/step", lambda s: _fmt(s.bytes_per_step, "bytes")),
        ("compression", lambda s: _fmt(s.compression_ratio, "x")),
        ("compute/comm/other", lambda s: f"{s.split.compute:.1f}/{s.split.communication:.1f}/{s.split.other:.1f}s"),
    ]
    if price is not None:
        cols += [
            ("cost/run", lambda s: _fmt(s.cost_per_run, "money")),
            ("cost to goal", lambda s: _fmt(s.cost_to_goal, "money")),
        ]
    return cols


def _notes(scores: Sequence[ConfigScore]) -> list[str]:
    out = []
    for s in scores:
        if s.flags:
            out.append(f"* {plots.config_label(s)}: " + "; ".join(s.flags))
    return out


def _legend(price: float | None) -> str:
    text = (
        f"Per configuration (runs differing only in their seed): time to goal = MLPerf's olympic mean "
        f"(fastest and slowest run dropped, a run that missed the goal counts as the slowest; {RUNS_REQUIRED} "
        "seeds wanted); min/max/stdev over the runs that reached the goal; speedup and efficiency against "
        "the smallest world size of the same family; seconds per run: compute/communication/other (rank 0)"
    )
    if price is not None:
        text += f"; cost = workers x hours x {price:g} per worker-hour"
    return textwrap.fill(text + ".", 110)


def format_scores(scores: Sequence[ConfigScore], price: float | None = None) -> str:
    """The per-configuration table, its legend and the flags of each configuration."""
    cols = _config_columns(scores, price)
    table = _text_table([h for h, _ in cols], [[f(s) for _, f in cols] for s in scores])
    return "\n".join([_legend(price), "", table, *_notes(scores)])


def format_markdown(runs: Sequence[RunSummary], scores: Sequence[ConfigScore], price: float | None = None) -> str:
    cols = _config_columns(scores, price)
    parts = [
        "## Runs",
        "",
        _markdown_table(COLUMNS, _run_rows(runs)),
        "",
        "## Configurations",
        "",
        _legend(price),
        "",
        _markdown_table([h for h, _ in cols], [[f(s) for _, f in cols] for s in scores]),
    ]
    notes = _notes(scores)
    return "\n".join(parts + (["", *notes] if notes else []))


def score_dict(s: ConfigScore) -> dict[str, Any]:
    c, t = s.configuration, s.time_to_goal
    return {
        "label": c.label(),
        "task": c.task,
        "division": c.division,
        "worldSize": c.world_size,
        "workers": c.workers,
        "slotsPerWorker": c.slots_per_worker,
        "backend": c.backend,
        "algorithm": c.algorithm,
        "bucketing": c.bucketing,
        "variant": s.variant,
        "runs": len(s.runs),
        "reached": s.reached,
        "successRate": s.success_rate,
        "seeds": [r.seed for r in s.runs],
        "timeToGoalSeconds": t.value,
        "timeToGoalMethod": t.method,
        "timeToGoalUsed": list(t.used),
        "timeToGoalDropped": list(t.dropped),
        "failureDropped": t.failure_dropped,
        "minSeconds": s.spread.min if s.spread else None,
        "maxSeconds": s.spread.max if s.spread else None,
        "stdevSeconds": s.spread.stdev if s.spread else None,
        "speedup": s.speedup,
        "efficiency": s.efficiency,
        "baselineWorldSize": s.baseline_world_size,
        "wallClockSeconds": s.wall_clock,
        "bestAccuracy": s.best_accuracy,
        "goalMode": (GoalMode.ACCURACY_AFTER_TIME if s.accuracy_after_time else GoalMode.TIME_TO_ACCURACY).value,
        "finalAccuracy": s.final_accuracy,
        "samplesPerSecond": s.samples_per_second,
        "computeSeconds": s.split.compute,
        "communicationSeconds": s.split.communication,
        "otherSeconds": s.split.other,
        "communicationShare": s.split.communication_share,
        "bytesPerStep": s.bytes_per_step,
        "compressionRatio": s.compression_ratio,
        "costPerRun": s.cost_per_run,
        "costToGoal": s.cost_to_goal,
        "flags": list(s.flags),
        "runNames": [r.name for r in s.runs],
        "sources": [r.source for r in s.runs],
    }


def format_json(
    runs: Sequence[LoadedRun],
    scores: Sequence[ConfigScore],
    price: float | None = None,
    unfinished: Sequence[Unfinished] = (),
) -> str:
    """Every run's summary (without its history; a collectives run's with its table, as it is not scored),
    every configuration's score, and the run folders that left no readable summary."""
    doc = {
        "runsRequired": RUNS_REQUIRED,
        "pricePerWorkerHour": price,
        "runs": [
            {"source": str(r.path), **r.summary.model_dump(mode="json", by_alias=True, exclude={"history"})}
            for r in runs
        ],
        "configurations": [score_dict(s) for s in scores],
        "unfinished": [{"source": str(u.path), "reason": u.reason, "counted": u.counts} for u in unfinished],
    }
    return json.dumps(doc, indent=2)


CSV_SKIP = ("timeToGoalUsed", "timeToGoalDropped", "sources")


def format_csv(scores: Sequence[ConfigScore]) -> str:
    """One row per configuration; lists joined with ``;``."""
    buf = io.StringIO()
    rows = [{k: v for k, v in score_dict(s).items() if k not in CSV_SKIP} for s in scores]
    if not rows:
        return ""
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "; ".join(map(str, v)) if isinstance(v, list) else v for k, v in row.items()})
    return buf.getvalue()
