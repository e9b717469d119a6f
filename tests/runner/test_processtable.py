"""The one walker of /proc (``mlbench_runner.processtable``), and a local run's tree taken and killed through it
(the worker pod's stop through it: tests/runner/test_worker.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from mlbench_runner.processtable import Process, parse_stat, process_table, read_process
from mlbench_runner.tools import processes

#: The fields after the state and parent pid of a real ``/proc/PID/stat`` line, up to the start time (6722371).
_MIDDLE = "26980 12917 0 -1 4194304 101 0 0 0 0 0 0 0 20 0 1 0"
_TAIL = "3133440 390 18446744073709551615 94001765474304 94001765494185 0 17 1 0 0"


def stat_line(pid: int, command: str, state: str, parent: int | str, started: int | str) -> str:
    return f"{pid} ({command}) {state} {parent} {_MIDDLE} {started} {_TAIL}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (stat_line(1234, "sshd", "S", 1, 6722371), Process("sshd", "S", 1, 6722371)),
        (stat_line(77, "python -m (x)", "R", 76, 5), Process("python -m (x)", "R", 76, 5)),  # spaces, parentheses
        (stat_line(9, "orted", "Z", 3, 90), Process("orted", "Z", 3, 90)),
        (stat_line(9, "orted", "Z", "x", 90), None),  # no parent
        (stat_line(9, "orted", "Z", 3, "-"), None),  # no start time
        ("1234 (sshd) S 1 1234 1234 0 -1 4194560 0", None),  # cut before the start time
        ("", None),
        ("5 (x) S", None),
        ("5 x S 4", None),
    ],
)
def test_parse_stat(text: str, expected: Process | None) -> None:
    assert parse_stat(text) == expected


def test_the_table_of_a_made_up_proc(tmp_path: Path) -> None:
    """Every numbered folder with a readable, well-formed stat; the rest (not a process, malformed) left out."""
    for pid, text in [
        (1, stat_line(1, "init", "S", 0, 1)),
        (40, stat_line(40, "sshd", "S", 1, 400)),
        (41, "41 (cut) S 1"),
    ]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(text)
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "stat").write_text(stat_line(40, "sshd", "S", 1, 400))
    (tmp_path / "42").mkdir()  # ended between the listing and the read: no stat
    assert process_table(tmp_path) == {1: Process("init", "S", 0, 1), 40: Process("sshd", "S", 1, 400)}
    assert read_process(40, tmp_path) == Process("sshd", "S", 1, 400)
    assert read_process(42, tmp_path) is None
    assert read_process(41, tmp_path) is None


@pytest.mark.multiproc
def test_a_local_runs_tree_names_each_process_by_its_start_and_kills_only_that_one() -> None:
    """(pid, start time) from the table: a pid whose start time differs (reused since) is never killed."""
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], text=True)
    try:
        deadline = time.monotonic() + 10
        while not (tree := processes.process_tree([parent])):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ((pid, started),) = tree
        now = read_process(pid)
        assert now is not None
        assert (now.command, now.parent, now.started) == ("sleep", parent.pid, started)
        processes.kill_tree({(pid, started + 1)})  # another process by now: spared
        time.sleep(0.2)
        assert read_process(pid) == now
        processes.kill_tree(tree)
        deadline = time.monotonic() + 10
        while (gone := read_process(pid)) is not None and gone.state != "Z":
            assert time.monotonic() < deadline, "the tree's process outlived kill_tree"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait()
