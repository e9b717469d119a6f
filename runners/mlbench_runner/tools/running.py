"""A marker in a result folder while ``mlbench run --local`` runs there.

``mlbench results`` counts a run folder without a summary as a run that missed the goal (it crashed or
was interrupted), but a study scored while its sweep goes on has one run folder that simply has no
summary *yet*. A file's age cannot tell the two apart (a fetched or just-crashed run is new too, and
clocks differ), so the command says so itself: the marker names its host and process, and it is
removed when the command ends, however it ends. A marker left by a killed command names a dead process.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: The marker's file name in the result folder.
MARKER = "running"
#: The lock a command holds while it takes the marker (see :func:`marked`).
LOCK = ".running.lock"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0 checks, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class AlreadyRunning(Exception):
    """Another command runs in the folder now: two runs there would overwrite each other's files."""

    def __init__(self, out: Path, pid: int | None) -> None:
        who = f"mlbench run (pid {pid})" if pid else "another mlbench run"
        super().__init__(f"--output-dir: {who} is already running in {out}")
        self.pid = pid


@contextmanager
def marked(out: Path) -> Iterator[None]:
    """The marker in ``out`` for as long as the block runs; :class:`AlreadyRunning` if a live command holds it.

    Taking it is one step under an exclusive lock on ``out/.running.lock`` (held only for that step, then removed;
    :func:`locked`): of two
    commands started at once in one folder exactly one runs; neither can remove the other's fresh marker as
    stale. The marker appears whole (written aside, then renamed), so that neither the other command nor
    ``mlbench results`` reads it empty. A marker that names no live process here (a killed command's, or another
    machine's, which cannot be checked and which ``mlbench results`` does not count either) is replaced.
    """
    path = out / MARKER
    with locked(out / LOCK):
        pid = running_pid(out)
        if pid is not None:
            raise AlreadyRunning(out, pid)
        aside = out / f".{MARKER}.{os.getpid()}"
        aside.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}) + "\n")
        aside.replace(path)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the file ``path`` for the block, and the file removed after it: a lock file left
    behind would be litter in the result folder (``mlbench results`` and a user's ``ls`` see it).

    Removing a lock file is safe only with a check: a command that opened the file before it was removed holds
    a lock on a file no one else will open, so whoever gets the lock checks that ``path`` is still the file it
    locked, and tries again on the new one if not.
    """
    while True:
        with path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held = os.fstat(handle.fileno())
            try:
                now = os.stat(path)
            except FileNotFoundError:
                continue
            if (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
                continue
            try:
                yield
            finally:
                path.unlink(missing_ok=True)  # still under the lock: no one holds the file that is removed
            return


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
