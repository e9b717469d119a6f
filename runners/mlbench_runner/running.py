"""A marker in a result folder while ``mlbench run --local`` runs there.

``mlbench results`` counts a run folder without a summary as a run that missed the goal (it crashed or
was interrupted), but a study scored while its sweep goes on has one run folder that simply has no
summary *yet*. A file's age cannot tell the two apart (a fetched or just-crashed run is new too, and
clocks differ), so the command says so itself: the marker names its host and process, and it is
removed when the command ends, however it ends. A marker left by a killed command names a dead process.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: The marker's file name in the result folder.
MARKER = "running"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0 checks, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


@contextmanager
def marked(out: Path) -> Iterator[None]:
    """The marker in ``out`` for as long as the block runs."""
    path = out / MARKER
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}) + "\n")
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def running_pid(out: Path, host: str | None = None, alive: Callable[[int], bool] = pid_alive) -> int | None:
    """The process still running a command in ``out`` (its marker names this host and a live process), or None:
    no marker, an unreadable one, one written on another machine (not checkable here) or by a dead process."""
    try:
        data = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    pid = data.get("pid") if isinstance(data, dict) else None
    if not isinstance(pid, int) or data.get("host") != (host or socket.gethostname()):
        return None
    return pid if alive(pid) else None
