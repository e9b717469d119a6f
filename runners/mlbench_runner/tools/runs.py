"""Result folders read back: a run's ``summary.json`` and ``config.json`` (:func:`load_run`), every run folder
below a path (:func:`find_results`), and a folder whose run left no readable summary (:class:`Unfinished`:
crashed, interrupted, or still running)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from mlbench_api.config import RunConfig
from mlbench_api.results import RunSummary
from mlbench_runner.tools import plots, running


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
