"""``mlbench-runner worker``: the OOM witness around sshd (the real OOM kill is in tests/e2e)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mlbench_runner.pod.worker import (
    EXIT_OOM,
    alive,
    memory_limit,
    oom_message,
    parse_oom_kills,
    ranks_below,
    read_oom_kills,
    stop_message,
    supervise,
)
from mlbench_runner.processtable import Process, descendants, process_table

REPO = Path(__file__).resolve().parents[2]

V2_EVENTS = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V2_EVENTS, 2),
        (V1_OOM_CONTROL, 5),
        ("oom_kill_disable 0\nunder_oom 0\n", None),  # kernels before 4.13 have no counter
        ("", None),
        ("oom_kill x\n", None),
    ],
)
def test_parse_oom_kills(text: str, expected: int | None) -> None:
    assert parse_oom_kills(text) == expected


def test_read_oom_kills_takes_the_first_readable_counter(tmp_path: Path) -> None:
    v1 = tmp_path / "oom_control"
    v1.write_text(V1_OOM_CONTROL)
    assert read_oom_kills([tmp_path / "missing", v1]) == 5
    assert read_oom_kills([tmp_path / "missing"]) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("536870912\n", 512 * 2**20), ("max\n", None), ("9223372036854771712\n", None), ("junk", None)],
)
def test_memory_limit(tmp_path: Path, text: str, expected: int | None) -> None:
    path = tmp_path / "limit"
    path.write_text(text)
    assert memory_limit([path]) == expected


def test_oom_message_names_the_worker_the_limit_and_the_field() -> None:
    text = oom_message("r-worker-1", 1, 256 * 2**20)
    assert text.startswith("OOMKilled:")
    assert "worker r-worker-1" in text
    assert "256 MiB" in text
    assert "spec.resources.memory" in text


@pytest.mark.multiproc
def test_child_exit_code_passes_through(tmp_path: Path) -> None:
    code = supervise([sys.executable, "-c", "raise SystemExit(7)"], termination_log=str(tmp_path / "log"), counters=[])
    assert code == 7
    assert not (tmp_path / "log").exists()


@pytest.mark.multiproc
def test_an_oom_kill_in_the_cgroup_stops_the_worker_with_137(tmp_path: Path) -> None:
    """A real child (a stand-in for sshd) keeps running; the counter rises; the worker ends it."""
    counter = tmp_path / "memory.events"
    counter.write_text("oom_kill 1\n")  # an earlier kill (before the worker started) is not ours
    limit = tmp_path / "memory.max"
    limit.write_text(str(300 * 2**20))
    log = tmp_path / "termination-log"

    def oom_later() -> None:
        time.sleep(0.6)
        counter.write_text("oom_kill 2\n")

    threading.Thread(target=oom_later, daemon=True).start()
    started = time.monotonic()
    code = supervise(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        termination_log=str(log),
        counters=[counter],
        limits=[limit],
        worker="run-worker-0",
        poll=0.05,
    )
    assert code == EXIT_OOM
    assert time.monotonic() - started < 30  # the child was killed, not waited out
    message = log.read_text()
    assert message.startswith("OOMKilled: the kernel killed 1 process(es) in worker run-worker-0")
    assert "300 MiB" in message


@pytest.mark.multiproc
def test_cli_runs_the_command_after_the_double_dash() -> None:
    from mlbench_runner.cli import main

    assert main(["worker", "--", sys.executable, "-c", "raise SystemExit(5)"]) == 5
    assert main(["worker"]) == 2


# -- a stop signal (the kubelet's SIGTERM) reaches sshd and the ranks below it ----------------------


#: sshd (10) with two sessions (11, 12); under 11 a shell, Open MPI's daemon and two ranks (14, 15), one of
#: which started a helper (16); under 12 a zombie rank (17); another tree elsewhere (20, 21).
TABLE = {
    10: Process("sshd", "S", 1, 1000),
    11: Process("sshd", "S", 10, 1100),
    12: Process("sshd", "S", 10, 1200),
    13: Process("bash", "S", 11, 1300),
    18: Process("orted", "S", 13, 1800),
    14: Process("python", "R", 18, 1400),
    15: Process("mlbench-runner", "R", 18, 1500),
    16: Process("compile worker", "S", 14, 1600),
    17: Process("python", "Z", 12, 1700),
    20: Process("sshd", "S", 1, 2000),
    21: Process("python", "S", 20, 2100),
}


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        (10, [11, 12, 13, 18, 14, 15, 16]),  # parents first, the zombie left out
        (11, [13, 18, 14, 15, 16]),
        (14, [16]),
        (16, []),
        (20, [21]),
        (99, []),
    ],
)
def test_descendants(root: int, expected: list[int]) -> None:
    assert descendants(TABLE, root) == expected


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        (1, [21, 14, 15, 16]),  # the worker as PID 1: sessions' shells, the daemon and sshd wait
        (10, [14, 15, 16]),
        (18, [14, 15, 16]),
        (12, []),  # only a zombie below
    ],
)
def test_a_stop_reaches_the_ranks_before_their_carriers(root: int, expected: list[int]) -> None:
    assert ranks_below(TABLE, root) == expected


@pytest.mark.multiproc
def test_descendants_of_a_real_child_include_its_child() -> None:
    child = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not (below := descendants(process_table(), child.pid)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        table = process_table()
        assert [table[pid].command for pid in below] == ["sleep"]
        assert table[child.pid][:3] == ("sh", table[child.pid].state, os.getpid())
        assert alive(table, below) == below
    finally:
        child.kill()
        child.wait()


def test_stop_message_names_the_worker_and_the_signal() -> None:
    text = stop_message("r-worker-1", signal.SIGTERM)
    assert text.startswith("worker r-worker-1 was stopped by SIGTERM")
    assert "ranks" in text


#: A rank under sshd: takes SIGTERM as its graceful stop, which takes a moment (its summary), then exits 3. It
#: says whether its parent (sshd's stand-in, a carrier) was still there to pass its last words on.
RANK = """
import os, pathlib, signal, sys, time
folder, parent = pathlib.Path(sys.argv[1]), os.getppid()
def stop(signum, frame):
    time.sleep(0.5)
    carrier = "carrier alive" if os.getppid() == parent else "orphaned"
    (folder / "stopped").write_text(f"{signal.Signals(signum).name}, {carrier}")
    sys.exit(3)
signal.signal(signal.SIGTERM, stop)
(folder / "ready").write_text("")
time.sleep(60)
"""

SUPERVISE = """
import sys
from mlbench_runner.pod.worker import supervise
sys.exit(supervise(sys.argv[2:], termination_log=sys.argv[1], counters=[], worker="r-worker-1", poll=0.05))
"""


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_a_stopped_worker_stops_the_ranks_waits_for_them_and_exits_128_plus_the_signal(tmp_path: Path) -> None:
    """sshd stops at once on SIGTERM (exit 0) and leaves its sessions' ranks running; the worker passes the
    signal to the rank first, waits for its graceful stop, then stops sshd (a shell that would die of it at
    once, here) and exits 143 with the cause in its termination log."""
    (tmp_path / "rank.py").write_text(RANK)
    log = tmp_path / "termination-log"
    sshd = f"{sys.executable} {tmp_path / 'rank.py'} {tmp_path} & wait; sleep 30"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("runners", "crds"))}
    worker = subprocess.Popen([sys.executable, "-c", SUPERVISE, str(log), "sh", "-c", sshd], env=env)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert worker.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        worker.kill()
    assert (tmp_path / "stopped").read_text() == "SIGTERM, carrier alive", "the rank stopped first, then sshd"
    assert log.read_text().startswith("worker r-worker-1 was stopped by SIGTERM")


@pytest.mark.multiproc
def test_supervise_puts_back_the_signal_handlers_it_found(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    supervise([sys.executable, "-c", "pass"], termination_log=str(tmp_path / "log"), counters=[])
    assert signal.getsignal(signal.SIGTERM) is before
