"""The process table from Linux ``/proc`` (stdlib only): what each process runs, its state, its parent and its
start time, and the live processes below one. The one walker of ``/proc`` for the worker pod's stop
(:mod:`mlbench_runner.pod.worker`) and a local run's (:mod:`mlbench_runner.tools.processes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

PROC = Path("/proc")
#: ``/proc/PID/stat``'s fields after the command: state (0), parent (1), ..., start time in clock ticks (19).
_STATE, _PARENT, _STARTED = 0, 1, 19


class Process(NamedTuple):
    """One line of the process table: what runs, its state (``Z``: a zombie, ended), its parent, and its start
    time in clock ticks since boot (with the pid, it names the process: a pid reused since starts later)."""

    command: str
    state: str
    parent: int
    started: int


def parse_stat(text: str) -> Process | None:
    """``/proc/PID/stat``'s command, state, parent pid and start time; None if malformed. The command, in
    parentheses, may hold spaces and parentheses itself, so the other fields are read after its last ``)``."""
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    if not head or len(fields) <= _STARTED or not (fields[_PARENT].isdigit() and fields[_STARTED].isdigit()):
        return None
    return Process(head.partition("(")[2], fields[_STATE], int(fields[_PARENT]), int(fields[_STARTED]))


def read_process(pid: int, proc: Path = PROC) -> Process | None:
    """The process ``pid`` as it is now; None once it has ended (or without a /proc)."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except OSError:
        return None


def process_table(proc: Path = PROC) -> dict[int, Process]:
    """Every process visible here by pid; empty without a /proc."""
    table: dict[int, Process] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            entry = parse_stat(stat.read_text())
        except OSError:  # the process ended meanwhile
            continue
        if entry is not None:
            table[int(stat.parent.name)] = entry
    return table


def descendants(table: Mapping[int, Process], root: int) -> list[int]:
    """Every live (not zombie) process below ``root`` in ``table``, parents before their children."""
    children: dict[int, list[int]] = {}
    for pid, entry in table.items():
        children.setdefault(entry.parent, []).append(pid)
    found: list[int] = []
    todo, seen = [root], {root}
    while todo:
        for pid in sorted(children.get(todo.pop(0), [])):
            if pid not in seen:
                seen.add(pid)
                todo.append(pid)
                if table[pid].state != "Z":
                    found.append(pid)
    return found
