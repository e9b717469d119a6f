"""``mlbench results DIR...``: a table of runs and two SVG plots.

Each DIR is a run's output directory (holding ``summary.json``), a summary file, or a cluster
run ``<namespace>/<run>``, whose kept results are downloaded first (``mlbench fetch``).
Plots: test accuracy against wall-clock time, and each run's per-phase time split
(compute vs communication), written next to the first run or to ``--plots DIR``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from mlbench_api.config import RunConfig
from mlbench_api.download import ResultsUnavailable, default_dir, download, parse_ref
from mlbench_api.results import RunSummary
from mlbench_api.task import DatasetFormat
from mlbench_runner.svg import line_chart, stacked_bars

COLUMNS = (
    "run",
    "task",
    "ranks",
    "backend",
    "status",
    "best acc",
    "target",
    "time to goal",
    "wall",
    "samples/s",
    "comm/compute",
)


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * value:.2f}%"
    if kind == "s":
        return f"{value:.1f}s"
    if kind == "ratio":
        return f"{value:.3f}"
    return f"{value:.1f}"


def format_table(summaries: list[RunSummary]) -> str:
    """A fixed-width text table, one row per run."""
    rows = [
        (
            s.run,
            s.task,
            str(s.environment.world_size),
            s.environment.backend,
            s.status,
            _fmt(s.best_accuracy, "pct"),
            _fmt(s.goal_target, "pct"),
            _fmt(s.time_to_goal_seconds, "s"),
            _fmt(s.wall_clock_seconds, "s"),
            _fmt(s.samples_per_second, "n"),
            _fmt(s.comm_compute_ratio, "ratio"),
        )
        for s in summaries
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    line = "  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def load_summary(path: Path) -> RunSummary:
    file = path / "summary.json" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"{path}: no summary.json")
    try:
        return RunSummary.model_validate_json(file.read_text())
    except ValidationError as exc:
        raise ValueError(f"{file}: not a RunSummary: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from exc


def dataset_note(path: Path) -> str | None:
    """What data a run used, from its ``config.json`` (figures must say e.g. "JPEG copy")."""
    config_file = (path if path.is_dir() else path.parent) / "config.json"
    try:
        config = RunConfig.model_validate_json(config_file.read_text())
    except (OSError, ValidationError):
        return None
    ds = config.task.dataset
    if ds.format in (DatasetFormat.IMAGE_TARBALL, DatasetFormat.IMAGE_FOLDER):
        what = "JPEG copy of CIFAR-10" if config.task.model.name.value == "resnet" else "image folder"
    elif ds.format is DatasetFormat.SYNTHETIC:
        what = "SYNTHETIC stand-in for epsilon (not epsilon)"
    else:
        what = ds.name
    subset = f", first {ds.train_subset} train samples" if ds.train_subset else ""
    return f"{config.task_name}: {what}{subset}"


def label(path: Path, s: RunSummary) -> str:
    return f"{s.run} ({s.environment.world_size}x{s.environment.backend})"


def write_plots(runs: list[tuple[Path, RunSummary]], dest: Path) -> list[Path]:
    """accuracy-vs-time.svg and phase-split.svg in ``dest``; returns their paths."""
    dest.mkdir(parents=True, exist_ok=True)
    series = [
        (label(p, s), [(h.wall_seconds, h.accuracy) for h in s.history if h.accuracy is not None]) for p, s in runs
    ]
    targets = {s.goal_target for _, s in runs if s.goal_target is not None}
    acc = dest / "accuracy-vs-time.svg"
    notes = sorted({n for p, _ in runs if (n := dataset_note(p))})
    caption = "Data: " + "; ".join(notes) if notes else None
    acc.write_text(
        line_chart(
            "Test accuracy vs wall-clock time",
            "seconds since run start",
            "test accuracy",
            series,
            hline=targets.pop() if len(targets) == 1 else None,
            ymax=1.0,
            caption=caption,
        )
    )
    bars = []
    for p, s in runs:
        ph = s.phases
        bars.append(
            (
                label(p, s),
                {
                    "data": ph.data,
                    "forward": ph.forward,
                    "backward": ph.backward,
                    "communication": ph.communication,
                    "optimizer": ph.optimizer,
                    "evaluation": ph.evaluation,
                },
            )
        )
    split = dest / "phase-split.svg"
    split.write_text(stacked_bars("Time per phase (rank 0): compute vs communication", "seconds", bars, caption))
    return [acc, split]


def resolve(arg: str, kubeconfig: str | None = None, context: str | None = None) -> Path:
    """A local path as it is; ``<namespace>/<run>`` (when no such path exists) downloaded from the cluster."""
    path = Path(arg)
    ref = None if path.exists() else parse_ref(arg)
    if ref is None:
        return path
    dest = default_dir(*ref)
    download(*ref, dest, kubeconfig=kubeconfig, context=context)
    print(f"fetched {arg} into {dest}")
    return dest


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``mlbench results``."""
    p = argparse.ArgumentParser(prog="mlbench results", description=__doc__)
    p.add_argument("dirs", nargs="+", help="run output directories, summary.json files or <namespace>/<run>")
    p.add_argument("--plots", help="where to write the SVG plots (default: the first run's directory)")
    p.add_argument("--kubeconfig", help="for <namespace>/<run>: default $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context", help="for <namespace>/<run>: the kubeconfig context")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    runs: list[tuple[Path, RunSummary]] = []
    for d in args.dirs:
        try:
            path = resolve(d, args.kubeconfig, args.context)
            runs.append((path, load_summary(path)))
        except (OSError, ValueError, ResultsUnavailable) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(format_table([s for _, s in runs]))
    first = runs[0][0]
    dest = Path(args.plots) if args.plots else (first if first.is_dir() else first.parent)
    for plot in write_plots(runs, dest):
        print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
