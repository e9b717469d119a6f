"""``mlbench results RUN...``: tables per run and per configuration, plots, and MLCommons mllog.

Each RUN is a run's output directory (holding ``summary.json``), a summary file, a directory
holding many of them (a sweep's output folder: every ``summary.json`` below it), or a cluster run
``<namespace>/<run>``, whose kept results are downloaded first (``mlbench fetch``).
Runs that differ only in their seed form one configuration, scored as MLPerf scores a benchmark
(mlbench_runner.tools.scoring, docs/results.md): the olympic mean of the time to goal (fastest and
slowest run dropped; 5 seeds wanted, fewer than 3 successes: plain mean, flagged), its spread,
the success rate, the speedup over the smallest world size, the cost with
``--price-per-worker-hour``, and the communication/computation split.
Plots (matplotlib when installed, else SVG) go next to the run (one RUN), into the sweep folder
given, or to ``--plots DIR``, which several RUNs need (their comparison would overwrite a run's own).
A run folder without a readable summary (crashed, interrupted) is named in a warning and, with its
``config.json``, counted as a run that missed the goal.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from mlbench_api.config import RunConfig
from mlbench_api.download import ResultsUnavailable, default_dir, download, parse_ref
from mlbench_api.results import RunSummary
from mlbench_api.task import GoalMode
from mlbench_runner.tools import mllog, plots, running, scoring
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


@dataclass(frozen=True)
class LoadedRun:
    path: Path
    """The result directory (or the summary file given)."""
    summary: RunSummary
    config: RunConfig | None
    """From ``config.json`` next to the summary, when there is one."""

    @property
    def directory(self) -> Path:
        return self.path if self.path.is_dir() else self.path.parent


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * value:.2f}%"
    if kind == "pct1":
        return f"{100 * value:.1f}%"
    if kind == "s":
        return f"{value:.1f}s"
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "x":
        return f"{value:.2f}x"
    if kind == "money":
        return f"{value:.4g}"
    if kind == "bytes":
        return _bytes(value)
    return f"{value:.1f}"


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


Column = tuple[str, Callable[[ConfigScore], str]]


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


# -- loading -------------------------------------------------------------------------------------


def load_summary(path: Path) -> RunSummary:
    file = path / "summary.json" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"{path}: no summary.json")
    try:
        return RunSummary.model_validate_json(file.read_text())
    except ValidationError as exc:
        raise ValueError(f"{file}: not a RunSummary: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{file}: not a RunSummary: not UTF-8 text") from exc


def load_config(path: Path) -> RunConfig | None:
    """The run's ``config.json`` (next to its summary), or None when absent or not a RunConfig. One that is
    there but unreadable (a newer runner's, hand-edited) is named on stderr: without it the run's division
    and configuration are unknown, so it is scored apart from its seeds, and that must not pass silently."""
    config_file = (path if path.is_dir() else path.parent) / "config.json"
    try:
        data = config_file.read_bytes()
    except OSError:
        return None
    try:
        return RunConfig.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        why = f"{where}: {first['msg']}"
        print(f"warning: {config_file}: not a RunConfig ({why}); its configuration is unknown", file=sys.stderr)
        return None


#: Files a run's folder has from the moment the run is set up (``run.yaml``: ``mlbench sweep --local``).
RUN_FILES = ("summary.json", "config.json", "run.yaml")


def find_results(path: Path) -> list[Path]:
    """``path`` when it is a summary file, else every result directory at or below it.

    A result directory is a run's folder: it has a ``summary.json``, or it has the ``config.json`` or
    ``run.yaml`` of a run that never wrote one (crashed, interrupted), which the report must count. A folder
    that is a run's and also holds others (``mlbench run --output`` given a study's folder) gives them all:
    its own files must not hide the runs below it.
    """
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted({p.parent for name in RUN_FILES for p in path.rglob(name)})
        if found:
            return found
        raise FileNotFoundError(f"{path}: no summary.json in it or below")
    raise FileNotFoundError(f"{path}: no summary.json")


@dataclass(frozen=True)
class Unfinished:
    """A run folder without a readable summary: the run crashed or was interrupted, or its summary is broken."""

    path: Path
    reason: str
    config: RunConfig | None
    """From its ``config.json``: without one the run cannot be told apart from others, so it is not scored."""
    live: bool = False
    """A command is still running there (:mod:`mlbench_runner.tools.running`): no summary *yet*, not counted."""

    @property
    def counts(self) -> bool:
        """Scored as a run of its configuration that missed the goal."""
        return self.config is not None and not self.live

    def warning(self) -> str:
        if self.live:
            counted = "not counted: it is still running"
        elif self.config is None:
            counted = "not counted (no readable config.json says which configuration it was)"
        else:
            counted = "counted as a run that missed the goal"
        return f"warning: {self.path}: {self.reason}; {counted}"


def load_run(path: Path) -> LoadedRun | Unfinished:
    """A result directory (or summary file) as a scored run, or as a run that left no readable summary."""
    file = path / "summary.json" if path.is_dir() else path
    if not file.exists():
        pid = running.running_pid(path) if path.is_dir() else None
        if pid is not None:
            return Unfinished(path, f"no summary.json yet: `mlbench run` (pid {pid}) is running there", None, True)
        return Unfinished(path, "no summary.json (the run crashed or was interrupted?)", load_config(path))
    try:
        return LoadedRun(path, load_summary(path), load_config(path))
    except (OSError, ValueError) as exc:  # a broken summary must not hide every other run's results
        reason = str(exc).removeprefix(f"{file}: ")
        return Unfinished(path, f"unreadable summary.json ({reason})", load_config(path))


def dataset_note(path: Path) -> str | None:
    """What data a run used, from its ``config.json`` (figures must say e.g. "JPEG copy")."""
    config = load_config(path)
    if config is None:
        return None
    return f"{config.task_name}: {plots.dataset_description(config)}"


def label(path: Path, s: RunSummary) -> str:
    return f"{s.run} ({s.environment.world_size}x{s.environment.backend})"


def _loaded(runs: Sequence[tuple[Path, RunSummary]] | Sequence[LoadedRun]) -> list[LoadedRun]:
    return [r if isinstance(r, LoadedRun) else LoadedRun(r[0], r[1], load_config(r[0])) for r in runs]


def _results(runs: Sequence[LoadedRun], unfinished: Sequence[Unfinished] = ()) -> list[scoring.RunResult]:
    measured = [scoring.run_result(r.summary, r.config, str(r.path)) for r in runs]
    return measured + [scoring.unfinished_result(u.config, str(u.path)) for u in unfinished if u.counts and u.config]


def write_plots(
    runs: Sequence[tuple[Path, RunSummary]] | Sequence[LoadedRun],
    dest: Path,
    *,
    price: float | None = None,
    fmt: str = "svg",
    scores: Sequence[ConfigScore] | None = None,
) -> list[Path]:
    """The figures (mlbench_runner.tools.plots) of these runs in ``dest``; returns their paths."""
    loaded = _loaded(runs)
    if scores is None:
        scores = scoring.score(_results(loaded), price)
    by_config = {r.source: plots.config_label(s) for s in scores for r in s.runs}
    targets = {r.summary.goal_target for r in loaded if r.summary.goal_target is not None}
    data = plots.PlotInput(
        caption=plots.caption([(r.summary, r.config) for r in loaded]),
        curves=[
            plots.Curve(
                label(r.path, r.summary),
                by_config.get(str(r.path), r.summary.task),
                [(h.wall_seconds, h.accuracy) for h in r.summary.history if h.accuracy is not None],
            )
            for r in loaded
        ],
        target=targets.pop() if len(targets) == 1 else None,
        scores=list(scores),
        price=price,
    )
    return plots.write_plots(data, dest, fmt)


def _file_name(name: str) -> str:
    """``name`` as one safe file name in the output folder: a summary's run name comes from the results (a
    cluster's ConfigMap), and ``/home/u/x`` or ``../x`` must not choose where a file is written."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    return safe or "run"


def write_mllog(runs: Sequence[LoadedRun], where: str | Path) -> list[Path]:
    """One mllog file per run: ``where`` itself for a single run (unless a directory, or ending in ``/``),
    else ``where/<result directory>.log``."""
    out = Path(where)
    if len(runs) == 1 and not out.is_dir() and not str(where).endswith("/"):
        out.parent.mkdir(parents=True, exist_ok=True)
        targets = [out]
    else:
        out.mkdir(parents=True, exist_ok=True)
        names: dict[str, int] = {}
        targets = []
        for r in runs:
            base = _file_name(r.directory.name or r.summary.run)
            n = names[base] = names.get(base, 0) + 1
            targets.append(out / (f"{base}.log" if n == 1 else f"{base}-{n}.log"))
    for r, target in zip(runs, targets, strict=True):
        target.write_text("\n".join(mllog.convert_dir(r.directory, r.summary, r.config)) + "\n")
    return targets


def resolve(arg: str, kubeconfig: str | None = None, context: str | None = None) -> Path:
    """A local path as it is; ``<namespace>/<run>`` (when no such path exists) downloaded from the cluster."""
    path = Path(arg)
    if path.exists():
        return path
    ref = parse_ref(arg)
    if ref is None or Path(ref[0]).is_dir():  # `mlbench-results/mistyped` is a path, not namespace/run
        raise FileNotFoundError(f"{arg}: no such file or directory")
    dest = default_dir(*ref)
    try:
        download(*ref, dest, kubeconfig=kubeconfig, context=context)
    except ResultsUnavailable as exc:
        raise ResultsUnavailable(f"{arg}: no such local path; as the cluster run {arg}: {exc}") from exc
    print(f"fetched {arg} into {dest}", file=sys.stderr)
    return dest


def _price(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a price >= 0, got {text}")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="mlbench results", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run output directories, summary.json files, folders of result directories, or <namespace>/<run>",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "csv", "markdown"),
        default="table",
        help="what to print: text tables (default), JSON (runs and configurations), CSV or Markdown",
    )
    p.add_argument(
        "--price-per-worker-hour", type=_price, metavar="PRICE", help="adds the cost: workers x hours x PRICE"
    )
    p.add_argument(
        "--plots",
        metavar="DIR",
        help="where to write the plots (default: the folder or the one run given; several RUNs need it)",
    )
    p.add_argument("--no-plots", action="store_true", help="write no plots")
    p.add_argument("--plot-format", choices=plots.FORMATS, default="svg", help="png needs matplotlib")
    p.add_argument("--mllog", metavar="PATH", help="also write each run as an MLCommons mllog file (a folder: several)")
    p.add_argument("--kubeconfig", help="for <namespace>/<run>: default $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context", help="for <namespace>/<run>: the kubeconfig context")
    return p.parse_args(argv)


def gather(args: argparse.Namespace) -> tuple[list[LoadedRun], list[Unfinished], list[Path]]:
    """Every RUN resolved (downloaded when ``<namespace>/<run>``) and read: the runs with a summary, as given
    (:func:`once` drops repeats), the folders without one (each once), and the folders given (``mlbench
    results SWEEP/``: where the plots go). Raises what makes a RUN unusable (OSError, ValueError,
    ResultsUnavailable)."""
    given: list[LoadedRun] = []
    unfinished: dict[Path, Unfinished] = {}
    folders: list[Path] = []
    for arg in args.runs:
        path = resolve(arg, args.kubeconfig, args.context)
        found = find_results(path)
        if found != [path]:
            folders.append(path)
        for f in found:
            loaded = load_run(f)
            if isinstance(loaded, Unfinished):
                unfinished.setdefault(loaded.path.resolve(), loaded)
            else:
                given.append(loaded)
    return given, list(unfinished.values()), folders


def once(given: Sequence[LoadedRun]) -> list[LoadedRun]:
    """The runs with each summary file once (a folder and a run in it given together)."""
    runs: list[LoadedRun] = []
    seen: set[Path] = set()
    for r in given:
        key = (r.path / "summary.json" if r.path.is_dir() else r.path).resolve()
        if key not in seen:
            seen.add(key)
            runs.append(r)
    return runs


@dataclass(frozen=True)
class Report:
    """What ``mlbench results`` scored: the training runs, the folders without a summary, the scores."""

    trained: list[LoadedRun]
    unfinished: list[Unfinished]
    scores: list[ConfigScore]


def print_scores(
    args: argparse.Namespace, given: Sequence[LoadedRun], runs: Sequence[LoadedRun], scored: Report
) -> None:
    """The tables in the ``--output`` format (``given``: as listed, for the table's duplicate count)."""
    price, scores, trained = args.price_per_worker_hour, scored.scores, scored.trained
    if args.output == "table":
        listed = [r for r in given if r.summary.collectives is None]
        print(format_table([r.summary for r in listed]))
        print()
        print(format_scores(scores, price))
        if len(listed) > len(trained):
            print(f"({len(listed) - len(trained)} summary file(s) given more than once, scored once)")
    elif args.output == "markdown":
        print(format_markdown([r.summary for r in trained], scores, price))
    elif args.output == "json":
        print(format_json(runs, scores, price, scored.unfinished))
    else:
        print(format_csv(scores), end="")


def write_files(args: argparse.Namespace, scored: Report, folders: Sequence[Path], status: TextIO) -> str | None:
    """The plots and mllog files asked for; the error to print when one cannot be written."""
    option = "--plots"
    try:
        if not args.no_plots and scored.trained:
            dest = plots_dir(args.plots, args.runs, folders, scored.trained)
            if dest is None:
                print("plots: several RUNs given: name a folder for the comparison plots with --plots DIR", file=status)
            else:
                price = args.price_per_worker_hour
                for plot in write_plots(scored.trained, dest, price=price, fmt=args.plot_format, scores=scored.scores):
                    print(f"wrote {plot}", file=status)
        option = "--mllog"
        if args.mllog:
            for path in write_mllog(scored.trained, args.mllog):
                print(f"wrote {path}", file=status)
    except OSError as exc:
        return f"{option}: cannot write {exc.filename}: {exc.strerror or exc}"
    return None


def print_collectives(runs: Sequence[LoadedRun], where: TextIO) -> None:
    """Task 0a runs: their table (bandwidth by size), which is not scored."""
    from mlbench_runner.tools.collective_table import format_table as sweep_table

    for r in runs:
        if r.summary.collectives is not None:
            print(f"{r.summary.run} ({r.summary.task}):\n{sweep_table(r.summary.collectives)}\n", file=where)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``mlbench results``: read, score, print, write; 2 for unusable input."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    problem = output_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        given, unfinished, folders = gather(args)
    except (OSError, ValueError, ResultsUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for u in unfinished:
        print(u.warning(), file=sys.stderr)
    runs = once(given)
    if not runs and not any(u.counts for u in unfinished):
        print("error: no readable summary.json to report on", file=sys.stderr)
        return 2
    collectives = [r for r in runs if r.summary.collectives is not None]
    if args.mllog and collectives:
        names = ", ".join(r.summary.run for r in collectives)
        print(
            f"error: --mllog: {names}: a collectives run (task 0a) has no MLPerf log (no training, no goal); "
            "leave it out of the RUNs or drop --mllog",
            file=sys.stderr,
        )
        return 2
    print_collectives(collectives, sys.stdout if args.output in ("table", "markdown") else sys.stderr)
    trained = [r for r in runs if r.summary.collectives is None]
    if collectives and not trained and not unfinished:
        if args.output == "json":  # machine-readable output keeps the collectives runs (summary with the table)
            print(format_json(runs, [], args.price_per_worker_hour))
        return 0
    scores = scoring.score(_results(trained, unfinished), args.price_per_worker_hour)
    scored = Report(trained, unfinished, scores)
    print_scores(args, given, runs, scored)
    status = sys.stdout if args.output == "table" else sys.stderr  # machine-readable output stays clean
    error = write_files(args, scored, folders, status)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def plots_dir(
    option: str | None, args: Sequence[str], folders: Sequence[Path], runs: Sequence[LoadedRun]
) -> Path | None:
    """Where the figures go: ``--plots``; else the folder given (``mlbench results SWEEP/``) or the one run's own
    folder; None for several RUNs, whose comparison would overwrite the first run's own figures."""
    if option:
        return Path(option)
    if len(args) == 1:
        return folders[0] if folders else runs[0].directory
    return None


def output_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--plots`` or ``--mllog`` (a file where a folder must be), before anything is read."""
    wanted = [("--plots", Path(args.plots))] if args.plots and not args.no_plots else []
    if args.mllog:
        mllog_path = Path(args.mllog)
        with contextlib.suppress(OSError):  # a name the system refuses: the write names it, with its words
            is_folder = mllog_path.is_dir() or str(args.mllog).endswith("/")
            wanted.append(("--mllog", mllog_path if is_folder else mllog_path.parent))
    for option, folder in wanted:
        try:
            for p in (folder, *folder.parents):
                if p.exists():
                    if not p.is_dir():
                        return f"{option}: {p} is a file, not a folder"
                    break
        except OSError as exc:  # a name too long, a folder not searchable
            return f"{option}: cannot use {exc.filename}: {exc.strerror or exc}"
    return None


if __name__ == "__main__":
    sys.exit(main())
