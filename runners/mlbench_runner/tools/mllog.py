"""A run's results as an MLCommons ``mllog`` log: ``mlbench results --mllog OUT RUN...``.

One ``:::MLLOG {json}`` line per event, the keys of MLPerf Training's logger
(``mlperf_logging.mllog``): ``namespace``, ``time_ms``, ``event_type`` (POINT_IN_TIME,
INTERVAL_START, INTERVAL_END), ``key``, ``value``, ``metadata`` (``file``/``lineno`` point at the
line of ``events.jsonl`` the event comes from; ``epoch_num``, ``status``, ...).

Converted from what a run already wrote (``events.jsonl``, ``summary.json``, ``config.json``)
rather than logged by the runner a second time: it works for every run ever kept, local or
fetched from a cluster, adds nothing to the training loop, and events.jsonl stays the one log.
How our events map (docs/results.md):

* ``submission_*``, ``seed``, ``global_batch_size``, ``opt_*``, ``train_samples``,
  ``eval_samples``: from the config and the run's ``hyperparameters`` event, at the run's start.
* ``init_start``/``init_stop``/``run_start``: the runner's clock starts before any data is touched
  and includes setting up (MLPerf leaves model initialisation outside its clock), so the MLPerf
  ``init`` interval holds only what our clock also leaves out, a one-time data ingest:
  ``run_start`` = ``run_stop`` - the run's wall clock, and ``run_stop - run_start`` is exactly
  ``wallClockSeconds`` (the time to goal of a run that reached it).
* ``epoch_start``/``epoch_stop``/``eval_accuracy``: the runner's own events (epochs from 1).
  ``eval_start``/``eval_stop``: the runner logs only the end of an evaluation, so ``eval_start``
  lies the mean evaluation time (summary phase totals / epochs) before it (``metadata.estimated``).
* ``run_stop``: ``status`` success when the goal was reached, else aborted (MLPerf's two values),
  with our own status and stop reason next to it.

Without ``events.jsonl`` the epochs come from the summary's history, timed from the summary
file's modification time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlbench_api.config import RunConfig
from mlbench_api.dataspec import DatasetFormat
from mlbench_api.results import RunSummary
from mlbench_api.schedule import Schedule

TOKEN = ":::MLLOG "
POINT, START, END = "POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END"
ORG = "MLBench"


@dataclass(frozen=True)
class Event:
    """One line of events.jsonl, with its 1-based line number."""

    lineno: int
    data: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.data.get("event", ""))

    @property
    def time_ms(self) -> int | None:
        t = self.data.get("time_ms")
        return int(t) if isinstance(t, int | float) else None


def read_events(path: Path) -> list[Event]:
    """Rank 0's events (other ranks' warnings are left out); unreadable lines are skipped."""
    events = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("rank", 0) == 0:
            events.append(Event(i, data))
    return events


def line(time_ms: int, event_type: str, key: str, value: Any = None, **metadata: Any) -> str:
    """One ``:::MLLOG`` line, keys in mllog's order."""
    record = {
        "namespace": "",
        "time_ms": int(time_ms),
        "event_type": event_type,
        "key": key,
        "value": value,
        "metadata": metadata,
    }
    return TOKEN + json.dumps(record)


def parse(text: str) -> list[dict[str, Any]]:
    """The records of the ``:::MLLOG`` lines of a log (other lines ignored)."""
    return [json.loads(ln[ln.index(TOKEN) + len(TOKEN) :]) for ln in text.splitlines() if TOKEN in ln]


class _Writer:
    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []
        self.last = 0

    def add(self, time_ms: int, event_type: str, key: str, value: Any = None, lineno: int = 0, **meta: Any) -> None:
        t = max(int(time_ms), self.last)  # never backwards
        self.last = t
        self.lines.append(line(t, event_type, key, value, file=self.source, lineno=lineno, **meta))


def _find(events: list[Event], name: str) -> Event | None:
    return next((e for e in events if e.name == name), None)


def _samples(config: RunConfig | None, hyper: Event | None, summary: RunSummary) -> tuple[int | None, int | None]:
    dataset = (hyper.data.get("dataset") if hyper else None) or {}
    train, test = dataset.get("train"), dataset.get("test")
    if config is not None:
        ds = config.task.dataset
        if train is None and ds.format is DatasetFormat.SYNTHETIC and ds.synthetic:
            train = min(ds.synthetic.train_samples, ds.train_subset or ds.synthetic.train_samples)
        if test is None and ds.format is DatasetFormat.SYNTHETIC and ds.synthetic:
            test = min(ds.synthetic.test_samples, ds.test_subset or ds.synthetic.test_samples)
        train = train if train is not None else ds.train_subset
        test = test if test is not None else ds.test_subset
    if train is None and summary.epochs > 0:
        train = round(summary.samples / summary.epochs)  # samples trained per epoch
    return (int(train) if train is not None else None), (int(test) if test is not None else None)


def _epochs(events: list[Event], summary: RunSummary, start_ms: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(epoch, {"start": (ms, lineno), "eval": (ms, lineno, accuracy), "stop": (ms, lineno)}) in order."""
    per: dict[int, dict[str, Any]] = {}
    for e in events:
        epoch = e.data.get("epoch")
        if e.name not in ("epoch_start", "eval_accuracy", "epoch_stop") or not isinstance(epoch, int):
            continue
        if e.time_ms is None:
            continue
        slot = per.setdefault(epoch, {})
        if e.name == "epoch_start":
            slot["start"] = (e.time_ms, e.lineno)
        elif e.name == "epoch_stop":
            slot["stop"] = (e.time_ms, e.lineno)
        elif isinstance(e.data.get("accuracy"), int | float):
            slot["eval"] = (e.time_ms, e.lineno, float(e.data["accuracy"]))
    if not per:  # no events: the summary's history
        previous = 0.0
        for h in summary.history:
            ms = start_ms + round(h.wall_seconds * 1000)
            slot = {"start": (start_ms + round(previous * 1000), 0), "stop": (ms, 0)}
            if h.accuracy is not None:
                slot["eval"] = (ms, 0, h.accuracy)
            per[h.epoch] = slot
            previous = h.wall_seconds
    yield from sorted(per.items())


def _add_hyperparameters(
    w: _Writer, begin: int, summary: RunSummary, config: RunConfig | None, hyper: Event | None
) -> None:
    """The run's seed, batch, optimizer and schedule, and its sample counts, as POINT events at ``begin``."""
    env = summary.environment
    hl = hyper.lineno if hyper is not None else 0
    seed = config.seed if config is not None else env.seed
    if seed is not None:
        w.add(begin, POINT, "seed", seed, hl)
    if config is not None:
        training, lr = config.task.training, config.lr
        w.add(begin, POINT, "global_batch_size", training.batch_size_per_worker * config.world_size, hl)
        w.add(begin, POINT, "gradient_accumulation_steps", 1, hl)
        w.add(begin, POINT, "opt_name", training.optimizer.value, hl)
        w.add(begin, POINT, "opt_base_learning_rate", lr.peak_lr, hl)
        if lr.schedule is Schedule.MULTI_STEP:
            w.add(begin, POINT, "opt_learning_rate_warmup_epochs", lr.warmup_epochs, hl)
            w.add(begin, POINT, "opt_learning_rate_decay_boundary_epochs", list(lr.milestones), hl)
            w.add(begin, POINT, "opt_learning_rate_decay_factor", lr.decay_factor, hl)
        w.add(begin, POINT, "opt_weight_decay", training.weight_decay, hl)
    train, test = _samples(config, hyper, summary)
    if train is not None:
        w.add(begin, POINT, "train_samples", train, hl)
    if test is not None:
        w.add(begin, POINT, "eval_samples", test, hl)


def convert(
    summary: RunSummary,
    config: RunConfig | None,
    events: list[Event],
    *,
    source: str = "events.jsonl",
    fallback_end_ms: int = 0,
) -> list[str]:
    """The run as mllog lines (see the module docstring for the mapping)."""
    wall_ms = round(summary.wall_clock_seconds * 1000)
    first, stop = _find(events, "run_start"), _find(events, "run_stop")
    if first is not None and first.time_ms is not None:
        begin = first.time_ms
        end = stop.time_ms if stop is not None and stop.time_ms is not None else begin + wall_ms
    else:
        end = fallback_end_ms or wall_ms
        begin = end - wall_ms
    run_start = max(begin, end - wall_ms)
    run_stop = run_start + wall_ms
    hyper = _find(events, "hyperparameters")
    w = _Writer(source)
    at = first.lineno if first is not None else 0
    env = summary.environment
    division = config.task.division.value if config is not None else "open"
    w.add(begin, POINT, "submission_benchmark", summary.task, at)
    w.add(begin, POINT, "submission_org", ORG, at)
    w.add(begin, POINT, "submission_division", division, at)
    platform = f"{env.world_size}x {env.devices[0]}" if env.devices else f"{env.world_size} ranks"
    w.add(begin, POINT, "submission_platform", platform, at)
    w.add(begin, POINT, "cache_clear", False, at)  # MLBench does not drop the OS caches
    _add_hyperparameters(w, begin, summary, config, hyper)
    w.add(begin, START, "init_start", None, at)
    w.add(run_start, END, "init_stop", None, at)
    w.add(run_start, START, "run_start", None, at)
    epochs = list(_epochs(events, summary, run_start))
    evaluated = sum(1 for _, slot in epochs if "eval" in slot)
    eval_ms = round(summary.phases.evaluation * 1000 / evaluated) if evaluated else 0
    for epoch, slot in epochs:
        start_ms, start_line = slot.get("start", (w.last, 0))
        w.add(min(start_ms, run_stop), START, "epoch_start", None, start_line, epoch_num=epoch)
        if "eval" in slot:
            ms, ln, accuracy = slot["eval"]
            ms = min(ms, run_stop)
            w.add(max(w.last, ms - eval_ms), START, "eval_start", None, ln, epoch_num=epoch, estimated=True)
            w.add(ms, END, "eval_stop", None, ln, epoch_num=epoch)
            w.add(ms, POINT, "eval_accuracy", accuracy, ln, epoch_num=epoch)
        stop_ms, stop_line = slot.get("stop", (w.last, 0))
        w.add(min(stop_ms, run_stop), END, "epoch_stop", None, stop_line, epoch_num=epoch)
    w.add(
        run_stop,
        END,
        "run_stop",
        None,
        stop.lineno if stop is not None else 0,
        status="success" if summary.goal_reached else "aborted",
        mlbench_status=summary.status,
        stop_reason=summary.stop_reason,
        epoch_num=epochs[-1][0] if epochs else 0,
    )
    return w.lines


def convert_dir(run_dir: Path, summary: RunSummary, config: RunConfig | None) -> list[str]:
    """The mllog lines of a result directory (its events.jsonl when there is one)."""
    events_file = run_dir / "events.jsonl"
    events = read_events(events_file) if events_file.exists() else []
    summary_file = run_dir / "summary.json"
    end = int(summary_file.stat().st_mtime * 1000) if summary_file.exists() else 0
    return convert(summary, config, events, source="events.jsonl", fallback_end_ms=end)
