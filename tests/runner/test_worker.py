"""``mlbench-runner worker``: the OOM witness around sshd (the real OOM kill is in tests/e2e)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from mlbench_runner.worker import (
    EXIT_OOM,
    memory_limit,
    oom_message,
    parse_oom_kills,
    read_oom_kills,
    supervise,
)

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


def test_child_exit_code_passes_through(tmp_path: Path) -> None:
    code = supervise([sys.executable, "-c", "raise SystemExit(7)"], termination_log=str(tmp_path / "log"), counters=[])
    assert code == 7
    assert not (tmp_path / "log").exists()


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


def test_cli_runs_the_command_after_the_double_dash() -> None:
    from mlbench_runner.cli import main

    assert main(["worker", "--", sys.executable, "-c", "raise SystemExit(5)"]) == 5
    assert main(["worker"]) == 2
