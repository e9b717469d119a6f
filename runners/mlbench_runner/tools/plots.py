"""The figures of ``mlbench results``: matplotlib when installed, else the hand-written SVG.

matplotlib is the optional "plots" extra (``make install`` puts it into the checkout's .venv);
without it :mod:`mlbench_runner.tools.svg` draws the same figures, under the same names, as SVG.
``MLBENCH_PLOTS=svg`` forces the built-in SVG, ``MLBENCH_PLOTS=matplotlib`` fails when matplotlib
is missing. Every figure carries a caption naming its data (the dataset, e.g. "CIFAR-10 (JPEG
copy)" or "synthetic epsilon stand-in", and the division) and saying that it is this machine's
measurement; SVG keeps it as text (and in the metadata), PNG in its Description metadata.

* ``accuracy-vs-time``: test accuracy of every run against wall-clock seconds, the target dashed;
* ``phase-split``: mean seconds per run of compute / communication / other, per configuration;
* ``speedup-vs-workers``: speedup of the time to goal against the world size, with the ideal line
  (when a family of configurations has two world sizes or more with a time to goal);
* ``cost-vs-workers``: cost to the goal and per run against the world size (with a price).
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlbench_api.config import RunConfig
from mlbench_api.dataspec import DatasetFormat
from mlbench_api.results import RunSummary
from mlbench_runner.tools import svg
from mlbench_runner.tools.scoring import ConfigScore, Configuration, device_of

BACKEND_ENV = "MLBENCH_PLOTS"
Points = list[tuple[float, float]]
COMPUTE, COMMUNICATION, OTHER = "compute", "communication", "other"


#: More curves than this (a sweep) are drawn one colour and one legend entry per configuration, not per run.
GROUPED_ABOVE = 10


@dataclass(frozen=True)
class Curve:
    """One run's test accuracy over time."""

    label: str
    group: str
    """Its configuration's label: with many runs the legend lists configurations, one colour each."""
    points: list[tuple[float, float]]


@dataclass
class PlotInput:
    caption: str
    curves: list[Curve] = field(default_factory=list)
    target: float | None = None
    scores: list[ConfigScore] = field(default_factory=list)
    price: float | None = None


# -- captions ------------------------------------------------------------------------------------


def dataset_description(config: RunConfig) -> str:
    """What data a run trained on, in words a figure can carry (e.g. "CIFAR-10 (JPEG copy)")."""
    ds = config.task.dataset
    where = " ".join(x.lower() for x in (ds.name, ds.path or "", ds.source.url if ds.source else ""))
    if ds.format in (DatasetFormat.IMAGE_TARBALL, DatasetFormat.IMAGE_FOLDER):
        what = "CIFAR-10 (JPEG copy)" if "cifar" in where else f"{ds.name} ({ds.format.value})"
    elif ds.format is DatasetFormat.CIFAR_PYTHON:
        what = "CIFAR-10 (python version)" if ds.name == "cifar10" else f"{ds.name} (cifar10-python format)"
    elif ds.format is DatasetFormat.SYNTHETIC:
        shape = ds.synthetic
        size = f", {shape.train_samples} train samples x {shape.features} features" if shape else ""
        what = (
            f"SYNTHETIC epsilon stand-in (not epsilon{size})"
            if "epsilon" in where or (shape and shape.features == 2000)
            else f"SYNTHETIC data ({ds.name}{size})"
        )
    else:
        what = f"{ds.name} ({ds.format.value})"
    subset = f", first {ds.train_subset} train samples" if ds.train_subset else ""
    return f"{what}{subset}"


def data_note(summary: RunSummary, config: RunConfig | None) -> str:
    """``<task>: <dataset> (<division> division)``."""
    if config is None:
        return f"{summary.task}: dataset unknown (no config.json)"
    return f"{config.task_name}: {dataset_description(config)} ({config.task.division.value} division)"


def caption(runs: Sequence[tuple[RunSummary, RunConfig | None]]) -> str:
    """Two lines: the data of every task shown, and whose measurement it is."""
    notes = list(dict.fromkeys(data_note(s, c) for s, c in runs))
    devices = list(dict.fromkeys(device_of(s) for s, _ in runs))
    n = len(runs)
    return (
        "Data: " + "; ".join(notes) + "\n"
        f"This machine's measurement ({', '.join(devices)}; {n} run{'s' if n != 1 else ''}), "
        "not a reference result."
    )


# -- back ends -----------------------------------------------------------------------------------


def backend() -> str:
    """``matplotlib`` when it imports (and MLBENCH_PLOTS is not ``svg``), else ``svg``."""
    choice = os.environ.get(BACKEND_ENV, "auto")
    if choice == "svg":
        return "svg"
    try:
        # Lazy: matplotlib is the optional `plots` extra (without it the SVG is drawn).
        import matplotlib  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415, F401
    except ImportError:
        if choice == "matplotlib":
            raise
        return "svg"
    return "matplotlib"


def family_label(c: Configuration, variant: str = "") -> str:
    return f"{c.task} {c.backend} {c.algorithm}/{c.bucketing}" + (f" [{variant}]" if variant else "")


def _families(scores: Sequence[ConfigScore]) -> dict[Configuration, list[ConfigScore]]:
    out: dict[Configuration, list[ConfigScore]] = {}
    for s in scores:
        out.setdefault(s.configuration.family(), []).append(s)
    return out


def _family_variant(members: Sequence[ConfigScore]) -> str:
    return members[0].variant


def _speedup_series(scores: Sequence[ConfigScore]) -> list[tuple[str, Points, int]]:
    """(label, [(world size, speedup)], baseline world size) per family with two or more points."""
    out = []
    for members in _families(scores).values():
        pts = [(float(s.configuration.world_size), s.speedup) for s in members if s.speedup is not None]
        if len(pts) >= 2 and members[0].baseline_world_size:
            label = family_label(members[0].configuration, _family_variant(members))
            out.append((label, [(x, y) for x, y in pts if y is not None], members[0].baseline_world_size))
    return out


def _cost_series(scores: Sequence[ConfigScore]) -> list[tuple[str, Points, Points]]:
    out = []
    for members in _families(scores).values():
        to_goal = [(float(s.configuration.world_size), s.cost_to_goal) for s in members if s.cost_to_goal is not None]
        per_run = [(float(s.configuration.world_size), s.cost_per_run) for s in members if s.cost_per_run is not None]
        if to_goal or per_run:
            label = family_label(members[0].configuration, _family_variant(members))
            out.append(
                (label, [(x, y) for x, y in to_goal if y is not None], [(x, y) for x, y in per_run if y is not None])
            )
    return out


def _variant(s: ConfigScore) -> str:
    return f" [{s.variant}]" if s.variant else ""


def config_label(s: ConfigScore) -> str:
    """A configuration's name with its variant (``... [batchSizePerWorker=64]``): configurations that differ
    only in a setting such as the batch size would otherwise share one name."""
    return s.configuration.label() + _variant(s)


def _bar_label(s: ConfigScore, several_families: bool) -> str:
    """The world size; with several families also what tells them apart (task, backend, algorithm, variant)."""
    c = s.configuration
    ranks = f"{c.world_size} ({c.workers}x{c.slots_per_worker})"
    if not several_families:
        return ranks
    return f"{ranks} {c.task} {c.backend} {c.algorithm}" + _variant(s)


TITLES = {
    "accuracy-vs-time": "Test accuracy vs wall-clock time",
    "phase-split": "Time per run by phase (rank 0, mean over runs): compute / communication / other",
    "speedup-vs-workers": "Speedup of the time to goal vs world size",
    "cost-vs-workers": "Cost vs world size: to the goal (olympic mean time) and per run (mean wall clock)",
}
RANKS = "ranks (workers x slots per worker)"


#: The figure formats ``mlbench results --plot-format`` offers.
FORMATS = ("svg", "png")


def write_plots(data: PlotInput, dest: Path, fmt: str = "svg") -> list[Path]:
    """The figures into ``dest`` (created); returns their paths. ``fmt``: svg or png (png needs matplotlib).

    Figures of ours that this call did not write (no speedup without a baseline that reached the goal, no cost
    without a price, the other format) are removed: an older figure beside the new tables would contradict them.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if backend() == "matplotlib":
        paths = _Matplotlib(data, dest, fmt).all()
    else:
        if fmt != "svg":
            print(f"matplotlib is not installed: writing SVG instead of {fmt}", file=sys.stderr)
        paths = _svg_plots(data, dest)
    for stale in {dest / f"{name}.{ext}" for name in TITLES for ext in FORMATS} - set(paths):
        stale.unlink(missing_ok=True)
    return paths


# -- the hand-written SVG ------------------------------------------------------------------------


def _svg_plots(data: PlotInput, dest: Path) -> list[Path]:
    paths = []
    acc = dest / "accuracy-vs-time.svg"
    acc.write_text(
        svg.line_chart(
            TITLES["accuracy-vs-time"],
            "seconds since run start",
            "test accuracy",
            [(c.group if len(data.curves) > GROUPED_ABOVE else c.label, c.points) for c in data.curves],
            hline=data.target,
            ymax=1.0,
            caption=data.caption,
        )
    )
    paths.append(acc)
    several = len(_families(data.scores)) > 1
    rows = [
        (
            _bar_label(s, several),
            {COMPUTE: s.split.compute, COMMUNICATION: s.split.communication, OTHER: s.split.other},
        )
        for s in data.scores
    ]
    split = dest / "phase-split.svg"
    split.write_text(svg.stacked_bars(TITLES["phase-split"], "seconds per run", rows, data.caption))
    paths.append(split)
    speedups = _speedup_series(data.scores)
    if speedups:
        series = [(label, pts) for label, pts, _ in speedups]
        series += [(f"ideal ({label})", [(x, x / base) for x, _ in pts]) for label, pts, base in speedups]
        path = dest / "speedup-vs-workers.svg"
        path.write_text(svg.line_chart(TITLES["speedup-vs-workers"], RANKS, "speedup", series, caption=data.caption))
        paths.append(path)
    costs = _cost_series(data.scores)
    if costs and data.price is not None:
        series = [(f"to goal: {label}", pts) for label, pts, _ in costs if pts]
        series += [(f"per run: {label}", pts) for label, _, pts in costs if pts]
        path = dest / "cost-vs-workers.svg"
        ylabel = f"cost at {data.price:g} per worker-hour"
        path.write_text(svg.line_chart(TITLES["cost-vs-workers"], RANKS, ylabel, series, caption=data.caption))
        paths.append(path)
    return paths


# -- matplotlib ----------------------------------------------------------------------------------


class _Matplotlib:
    """Each figure on its own Figure (no pyplot: no global state, no display needed)."""

    def __init__(self, data: PlotInput, dest: Path, fmt: str) -> None:
        # Lazy: matplotlib is the optional `plots` extra (without it the SVG is drawn).
        from matplotlib.figure import Figure  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        self.Figure = Figure
        self.data, self.dest, self.fmt = data, dest, fmt
        self.lines = svg.caption_lines(data.caption, 150)

    def all(self) -> list[Path]:
        paths = [self.accuracy(), self.phases()]
        speedups = _speedup_series(self.data.scores)
        if speedups:
            paths.append(self.speedup(speedups))
        costs = _cost_series(self.data.scores)
        if costs and self.data.price is not None:
            paths.append(self.cost(costs, self.data.price))
        return paths

    def _figure(self, name: str) -> tuple[Any, Any]:
        fig = self.Figure(figsize=(9.0, 5.2 + 0.16 * len(self.lines)))
        bottom = (0.62 + 0.16 * len(self.lines)) / fig.get_figheight()
        fig.subplots_adjust(left=0.08, right=0.70, top=0.9, bottom=bottom + 0.06)
        ax = fig.add_subplot()
        ax.set_title(TITLES[name], fontsize=11)
        ax.grid(True, alpha=0.3)
        ax.set_axisbelow(True)
        fig.text(0.01, 0.012, "\n".join(self.lines), ha="left", va="bottom", fontsize=7.5, color="#444")
        return fig, ax

    def _save(self, fig: Any, ax: Any, name: str) -> Path:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        handles, labels = ax.get_legend_handles_labels()
        if handles:
            wrapped = ["\n".join(textwrap.wrap(text, 32)) for text in labels]
            ax.legend(handles, wrapped, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
        path = self.dest / f"{name}.{self.fmt}"
        meta: dict[str, str | None] = {"Title": TITLES[name], "Description": self.data.caption}
        if self.fmt == "svg":
            meta["Date"] = None  # reproducible files
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "mlbench"}):
            fig.savefig(path, format=self.fmt, metadata=meta)
        return path

    def accuracy(self) -> Path:
        fig, ax = self._figure("accuracy-vs-time")
        curves = self.data.curves
        by_group = len(curves) > GROUPED_ABOVE
        colors: dict[str, str] = {}
        for i, c in enumerate(curves):
            key = c.group if by_group else c.label
            first = key not in colors
            colors.setdefault(key, f"C{len(colors) % 10}")
            xs, ys = [p[0] for p in c.points], [p[1] for p in c.points]
            ax.plot(
                xs,
                ys,
                marker="o",
                markersize=3,
                linewidth=1.2 if by_group else 1.6,
                alpha=0.7 if by_group else 1.0,
                color=colors[key],
                label=key if first else None,
                zorder=2 + i,
            )
        if self.data.target is not None:
            ax.axhline(self.data.target, color="black", linestyle="--", linewidth=1, label="target")
        ax.set_ylim(0.0, 1.0)
        ax.set_xlim(left=0.0)
        ax.set_xlabel("seconds since run start")
        ax.set_ylabel("test accuracy")
        return self._save(fig, ax, "accuracy-vs-time")

    def phases(self) -> Path:
        fig, ax = self._figure("phase-split")
        scores = self.data.scores
        several = len(_families(scores)) > 1
        xs = list(range(len(scores)))
        bottom = [0.0] * len(scores)
        for part, color in ((COMPUTE, "C0"), (COMMUNICATION, "C1"), (OTHER, "C7")):
            heights = [getattr(s.split, part) for s in scores]
            ax.bar(xs, heights, bottom=bottom, color=color, label=part, width=0.6)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_xticks(xs, [_bar_label(s, several) for s in scores], rotation=20 if several else 0, fontsize=8)
        ax.set_xlabel(RANKS)
        ax.set_ylabel("seconds per run (mean)")
        return self._save(fig, ax, "phase-split")

    def speedup(self, series: list[tuple[str, Points, int]]) -> Path:
        fig, ax = self._figure("speedup-vs-workers")
        ticks: set[float] = set()
        for i, (label, pts, base) in enumerate(series):
            xs = [x for x, _ in pts]
            ticks.update(xs)
            ax.plot(xs, [y for _, y in pts], marker="o", color=f"C{i % 10}", label=label)
            ideal = [min(xs), max(xs)]
            ax.plot(
                ideal,
                [x / base for x in ideal],
                linestyle="--",
                color="gray",
                linewidth=1,
                label="ideal (linear)" if i == 0 else None,
            )
        ax.set_xticks(sorted(ticks))
        ax.set_xlabel(RANKS)
        ax.set_ylabel("speedup (baseline time / time)")
        ax.set_ylim(bottom=0.0)
        return self._save(fig, ax, "speedup-vs-workers")

    def cost(self, series: list[tuple[str, Points, Points]], price: float) -> Path:
        fig, ax = self._figure("cost-vs-workers")
        ticks: set[float] = set()
        for i, (label, to_goal, per_run) in enumerate(series):
            color = f"C{i % 10}"
            if to_goal:
                ax.plot(*zip(*to_goal, strict=True), marker="o", color=color, label=f"to goal: {label}")
            if per_run:
                ax.plot(*zip(*per_run, strict=True), marker="s", linestyle=":", color=color, label=f"per run: {label}")
            ticks.update(x for x, _ in to_goal + per_run)
        ax.set_xticks(sorted(ticks))
        ax.set_xlabel(RANKS)
        ax.set_ylabel(f"cost at {price:g} per worker-hour")
        ax.set_ylim(bottom=0.0)
        return self._save(fig, ax, "cost-vs-workers")
