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
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from mlbench_api.download import ResultsUnavailable, default_dir, download, parse_ref
from mlbench_api.results import RunSummary
from mlbench_runner.tools import mllog, plots, scoring
from mlbench_runner.tools.collective_table import format_table as sweep_table
from mlbench_runner.tools.runs import LoadedRun, Unfinished, find_results, label, load_config, load_run
from mlbench_runner.tools.scoring import ConfigScore
from mlbench_runner.tools.tables import format_csv, format_json, format_markdown, format_scores, format_table


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
    for r in runs:
        if r.summary.collectives is not None:
            print(f"{r.summary.run} ({r.summary.task}):\n{sweep_table(r.summary.collectives)}\n", file=where)


class Unusable(Exception):
    """Input or options ``mlbench results`` cannot use: one line on stderr, exit 2."""


def read_runs(args: argparse.Namespace) -> tuple[list[LoadedRun], list[Unfinished], list[Path], list[LoadedRun]]:
    """The runs given, those that left no readable summary (each warned of), the folders given, and the runs
    once each; raises :class:`Unusable`."""
    problem = output_problem(args)
    if problem:
        raise Unusable(problem)
    try:
        given, unfinished, folders = gather(args)
    except (OSError, ValueError, ResultsUnavailable) as exc:
        raise Unusable(str(exc)) from exc
    for u in unfinished:
        print(u.warning(), file=sys.stderr)
    runs = once(given)
    if not runs and not any(u.counts for u in unfinished):
        raise Unusable("no readable summary.json to report on")
    collectives = [r.summary.run for r in runs if r.summary.collectives is not None]
    if args.mllog and collectives:
        raise Unusable(
            f"--mllog: {', '.join(collectives)}: a collectives run (task 0a) has no MLPerf log (no training, "
            "no goal); leave it out of the RUNs or drop --mllog"
        )
    return given, unfinished, folders, runs


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``mlbench results``: read, score, print, write; 2 for unusable input."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        given, unfinished, folders, runs = read_runs(args)
    except Unusable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    collectives = [r for r in runs if r.summary.collectives is not None]
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
