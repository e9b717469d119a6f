"""``mlbench watch`` against the real control plane (kwok nodes): it follows a run until it ends and exits with
its outcome. Needs the test cluster (marked ``cluster``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlbench_api.watch import EXIT_DELETED, EXIT_FAILED, EXIT_SUCCEEDED, EXIT_UNAVAILABLE
from tests import factories
from tests.operator import helpers as h
from tests.operator.conftest import Runs

pytestmark = pytest.mark.cluster


def watch(runs: Runs, name: str) -> subprocess.Popen[str]:
    env = {**os.environ, "KUBECONFIG": str(runs.cluster.kubeconfig)}
    command = [sys.executable, "-m", "mlbench_api.cli", "watch", f"{runs.ns}/{name}"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize(("code", "expected", "last"), [(0, EXIT_SUCCEEDED, "Succeeded"), (1, EXIT_FAILED, "Failed")])
def test_watch_follows_a_run_to_its_end(runs: Runs, code: int, expected: int, last: str) -> None:
    name = f"watch{code}"
    runs.apply(h.run(name, workers=1, runPolicy={"maxRestarts": 0}))  # a failed launcher fails the run at once
    proc = watch(runs, name)
    runs.wait_phase(name, "Running")
    assert proc.stdout is not None
    seen: list[str] = []  # the watch prints Running before the launcher ends (it may start after the run got there)
    while not seen or not seen[-1].startswith("Running"):
        line = proc.stdout.readline()
        assert line, f"the watch ended before it printed Running: {seen}"
        seen.append(line)
    runs.finish_launcher(
        name, code, factories.summary(name, world_size=1).termination_message() if code == 0 else "boom"
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == expected, err
    lines = [*seen, *out.splitlines()]
    assert lines[-1].startswith(last), lines


def test_watch_of_a_missing_run_fails_with_one_line(runs: Runs) -> None:
    proc = watch(runs, "no-such-run")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_UNAVAILABLE
    assert "Traceback" not in err
    assert "HTTP 404" in err


def test_watch_of_a_run_deleted_while_watched_exits_deleted(runs: Runs) -> None:
    runs.apply(h.run("watchdel", workers=1))
    proc = watch(runs, "watchdel")
    runs.wait_phase("watchdel", "Running")
    assert proc.stdout is not None
    assert proc.stdout.readline(), "the watch printed nothing"  # it follows the run before the deletion
    runs.kubectl("delete", "benchmarkrun", "watchdel", "--wait=false")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_DELETED, err
    assert out.splitlines()[-1] == "deleted while watched", out
