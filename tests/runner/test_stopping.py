"""How a rank, the pod launcher and the local command take stop signals (real signals to real processes)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlbench_api import bundle
from mlbench_api.common import API_VERSION as API
from mlbench_api.results import RunSummary
from mlbench_runner import stopping
from mlbench_runner.launch import strip_tag, summary_from_line

from .helpers import env, logreg_task, make_config, run_doc, write_yaml


def _signal_self(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs in the main thread at the next bytecode boundary


def _interrupted_run(sig: signal.Signals, done: list[str]) -> None:
    """A run stopped by ``sig`` whose clean-up (the summary) is hit by a second Ctrl-C and a SIGTERM."""
    with stopping.stop_once():
        try:
            _signal_self(sig)
            pytest.fail("no Interrupted")
        finally:
            _signal_self(signal.SIGINT)
            _signal_self(signal.SIGTERM)
            done.append("summary written")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_rank_stops_on_its_first_signal_and_only_notes_the_next(sig: signal.Signals) -> None:
    before = signal.getsignal(signal.SIGTERM)
    done: list[str] = []
    with pytest.raises(stopping.Interrupted) as caught:
        _interrupted_run(sig, done)
    assert done == ["summary written"]
    assert caught.value.signal == sig.name
    assert isinstance(caught.value, KeyboardInterrupt)  # every Ctrl-C clean-up runs for a SIGTERM too
    assert signal.getsignal(signal.SIGTERM) is before
    assert stopping.received() is None  # the next run in this process starts clean


def test_after_hold_even_the_first_signal_is_only_noted() -> None:
    """A run that is already finishing (an error, a stop decision) writes its summary whatever comes."""
    with stopping.stop_once():
        stopping.hold()
        _signal_self(signal.SIGTERM)
        assert stopping.received() == "SIGTERM"


def test_the_pod_launcher_passes_on_one_sigterm(tmp_path: Path) -> None:
    """A deleted pod (SIGTERM) and a Ctrl-C (SIGINT) reach mpirun as one SIGTERM: a second SIGINT would make
    it kill the ranks before they write their summaries."""
    counted = tmp_path / "signals"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "got = []\n"
            "signal.signal(signal.SIGTERM, lambda n, f: got.append(signal.Signals(n).name))\n"
            "signal.signal(signal.SIGINT, lambda n, f: got.append(signal.Signals(n).name))\n"
            "print('ready', flush=True)\n"
            "time.sleep(1.5)\n"
            f"open({str(counted)!r}, 'w').write(' '.join(got))\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    with stopping.forwarded_once(child) as sent:
        assert not sent.is_set()
        _signal_self(signal.SIGTERM)
        _signal_self(signal.SIGINT)
        _signal_self(signal.SIGTERM)
        assert sent.is_set()
        assert child.wait(timeout=10) == 0
    assert counted.read_text() == "SIGTERM"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_the_local_command_takes_sigterm_and_sighup_as_a_ctrl_c(sig: signal.Signals) -> None:
    """``timeout`` and a closed terminal take the Ctrl-C path: the ranks get their SIGINT and settle."""
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt), stopping.interrupt_on():
        _signal_self(sig)
    assert signal.getsignal(sig) is before


@pytest.mark.parametrize(
    ("line", "text"),
    [
        ('[1,0]<stdout>:{"a": 1}', '{"a": 1}'),
        ('[1,12]<stderr>:{"eval[1,12]<stderr>:uation": 2}', '{"evaluation": 2}'),  # one line in two pieces
        ("[2,0]<stdout>:x [2,0]<stdout>:y [2,0]<stdout>:z", "x y z"),
        ("[1,0]<stdout>:keeps [1,1]<stdout>: another rank", "keeps [1,1]<stdout>: another rank"),
        ("no tag [1,0]<stdout>: inside", "no tag [1,0]<stdout>: inside"),
        ("[x]<stdout>:not a tag", "[x]<stdout>:not a tag"),
    ],
)
def test_strip_tag_drops_every_piece_tag_of_the_line(line: str, text: str) -> None:
    assert strip_tag(line) == text


def test_a_mangled_summary_line_is_no_summary_and_no_crash() -> None:
    """Another rank's piece inside rank 0's summary line: summary.json stands instead; the launcher goes on."""
    mangled = '[1,0]<stdout>:{"rank": 0, "summary": {"schema": "mlbench.io/summary/v1", "run[1,1]<stdout>:x": 1}'
    assert summary_from_line(mangled + ', "event": "run_summary"}') is None
    assert summary_from_line('[1,0]<stdout>:["event", "run_summary"]') is None
    assert summary_from_line('[1,0]<stdout>:{"event": "run_summary"}') is None


# --- whole runs: the local command and the pod launcher, stopped as a user, `timeout` or the kubelet would


def _left_running(marker: str) -> list[str]:
    """Command lines of this machine's processes that mention ``marker`` (a test's own output folder)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in text:
            found.append(text)
    return found


def _wait_for_training(proc: subprocess.Popen[str], events: Path) -> None:
    deadline = time.monotonic() + 120
    while '"epoch_start"' not in (events.read_text() if events.exists() else ""):
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.2)


def _stop_and_wait(proc: subprocess.Popen[str], sig: signal.Signals, group: bool) -> str:
    (os.killpg if group else os.kill)(proc.pid, sig)
    try:
        return proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("launcher", "sig", "group"),
    [
        ("process", signal.SIGINT, False),  # `kill -INT` to the command alone: it passes the Ctrl-C on
        ("process", signal.SIGTERM, False),  # `timeout`, a supervisor
        ("mpirun", signal.SIGINT, False),
        ("mpirun", signal.SIGINT, True),  # a terminal's Ctrl-C: the whole process group
    ],
)
def test_a_stopped_local_run_leaves_its_summary_and_no_process(
    tmp_path: Path, launcher: str, sig: signal.Signals, group: bool
) -> None:
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is not installed on this machine")
    task = write_yaml(
        tmp_path / "task.yaml",
        {"apiVersion": API, "kind": "BenchmarkTask", "metadata": {"name": "tiny"}, "spec": logreg_task(epochs=10**5)},
    )
    run = write_yaml(tmp_path / "run.yaml", run_doc("stopped", "tiny", 2))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mlbench_runner.local", str(run), "--local", "--task-file", str(task)]
    cmd += ["--launcher", launcher, "--output", str(out)]
    # a session of its own, as a command in a terminal has
    proc = subprocess.Popen(
        cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    _wait_for_training(proc, out / "events.jsonl")
    output = _stop_and_wait(proc, sig, group)
    assert proc.returncode == 130, output[-3000:]
    assert not _left_running(str(out)), "a rank or mpirun outlived the command"
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    assert (summary.status, summary.stop_reason) == ("aborted", "interrupted")
    assert '"run_stop"' in (out / "output.log").read_text()  # what the ranks said as they stopped is kept


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_deleted_launcher_pod_still_reports_the_aborted_summary(tmp_path: Path) -> None:
    """The kubelet's SIGTERM to the launcher (PID 1 of its pod): mpirun stops the ranks, the summary and the
    results line still come out, and the termination log says aborted/interrupted, exit 3."""
    if shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is not installed on this machine")
    from mlbench_runner.launch import launcher_command
    from mlbench_runner.world import free_port

    out = tmp_path / "launch"
    out.mkdir()
    (out / "config.json").write_text(make_config(logreg_task(epochs=10**5), out, 2).dump())
    (out / "hostfile").write_text("localhost slots=2\n")
    cmd = launcher_command(out / "config.json", out / "hostfile", out / "termination-log", oversubscribe=True)
    proc = subprocess.Popen(
        cmd,
        env=env(MASTER_PORT=str(free_port())),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _wait_for_training(proc, out / "events.jsonl")
    output = _stop_and_wait(proc, signal.SIGTERM, group=False)
    assert proc.returncode == 3, output[-3000:]
    assert not _left_running(str(out)), "a rank or mpirun outlived the launcher"
    summary = RunSummary.from_termination_message((out / "termination-log").read_text())
    assert (summary.status, summary.stop_reason) == ("aborted", "interrupted")
    kept = bundle.parse_line(output.rstrip("\n").rsplit("\n", 1)[-1])  # the operator keeps the results
    assert kept is not None
    assert kept.summary is not None
    assert kept.summary.stop_reason == "interrupted"


def test_a_stop_signal_cuts_the_linger_for_the_last_scrape_short() -> None:
    """A finished rank waits for Prometheus's last scrape; a SIGTERM then (a deleted pod) ends the wait."""
    import threading

    with stopping.stop_once():
        stopping.hold()
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = time.monotonic()
        stopping.linger(30)
        assert time.monotonic() - started < 10
