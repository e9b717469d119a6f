"""MLPerf-style structured event log: one JSON object per line.

Rank 0 writes every event to stdout and ``<output_dir>/events.jsonl`` (the launcher and
``mlbench run --local`` read stdout); other ranks only report warnings and errors. Keys:
``event`` (run_start, hyperparameters, epoch_start, epoch_stop, eval_accuracy,
train_progress, run_stop, run_summary, ...), ``time_ms`` (Unix epoch ms), ``rank``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, TextIO

import structlog


class _Tee:
    """A structlog logger writing each rendered line to several streams."""

    def __init__(self, streams: list[TextIO]) -> None:
        self.streams = streams

    def msg(self, message: str) -> None:
        for stream in self.streams:
            stream.write(message + "\n")
            stream.flush()

    info = warning = error = debug = critical = msg


def _stamp(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event_dict.setdefault("time_ms", int(time.time() * 1000))
    return event_dict


class EventLog:
    """``log.event("epoch_stop", epoch=3)`` on rank 0; warnings/errors on every rank."""

    def __init__(self, rank: int, output_dir: str | Path | None) -> None:
        self.rank = rank
        self._file: TextIO | None = None
        streams: list[TextIO] = [sys.stdout]
        if rank == 0 and output_dir is not None:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            self._file = (Path(output_dir) / "events.jsonl").open("a")
            streams.append(self._file)
        self._log = structlog.wrap_logger(
            _Tee(streams),
            processors=[_stamp, structlog.processors.add_log_level, structlog.processors.JSONRenderer(sort_keys=False)],
        ).bind(rank=rank)

    def event(self, name: str, **values: Any) -> None:
        if self.rank == 0:
            self._log.info(name, **values)

    def warning(self, name: str, **values: Any) -> None:
        self._log.warning(name, **values)

    def error(self, name: str, **values: Any) -> None:
        self._log.error(name, **values)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
