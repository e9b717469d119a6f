"""How a rank, the pod launcher and the local command take stop signals (real signals to real processes)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mlbench_api import bundle
from mlbench_api.common import API_VERSION as API
from mlbench_api.results import RunSummary
from mlbench_runner import stopping
from mlbench_runner.pod.launch import strip_tag, summary_from_line
from tests import factories

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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
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


_EARLY = """
import contextlib, os, signal, sys, time
from mlbench_runner import stopping
with stopping.noted_early() if sys.argv[1] == "noted" else contextlib.nullcontext():
    os.kill(os.getpid(), signal.SIGUSR1)  # the launcher's stop while the rank still imports torch
    time.sleep(0.05)
    try:
        with stopping.stop_once():
            print("the block ran")
    except stopping.Interrupted as exc:
        print("stopped by", exc.signal)
        sys.exit(3)
"""


@pytest.mark.multiproc
@pytest.mark.parametrize(("mode", "code", "said"), [("noted", 3, "stopped by SIGUSR1\n"), ("bare", -10, "")])
def test_a_stop_signal_before_the_ranks_handlers_is_raised_when_they_take_over(mode: str, code: int, said: str) -> None:
    """Without noted_early the signal's default action ends the rank with no word (the bare case, the control)."""
    cmd = [sys.executable, "-c", _EARLY, mode]
    done = subprocess.run(cmd, check=False, env=env(), capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (code, said), done.stderr


def test_the_rank_commands_note_stop_signals_for_their_whole_life(monkeypatch: pytest.MonkeyPatch) -> None:
    """Noted from before torch's import to the end; the handlers the command found are back after it."""
    from mlbench_runner import cli

    before = signal.getsignal(signal.SIGUSR1)
    seen: list[object] = []

    def rank(_args: object) -> int:
        seen.append(signal.getsignal(signal.SIGUSR1))
        return 0

    for command, name in (("_train", "_train_rank"), ("_collectives", "_collectives_rank")):
        monkeypatch.setattr(cli, name, rank)
        assert getattr(cli, command)(None) == 0
        assert signal.getsignal(signal.SIGUSR1) is before
    assert seen == [stopping._note_early, stopping._note_early]


def test_a_signal_after_the_policy_is_only_noted_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with stopping.noted_early():
        with stopping.stop_once():
            pass
        _signal_self(signal.SIGTERM)  # the summary is written, the rank is on its way out
        assert stopping.pending() is signal.SIGTERM
    assert stopping.pending() is None
    assert signal.getsignal(signal.SIGTERM) is before


_COUNTER = """
import signal, sys, time
got = []
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(sig, lambda n, f: got.append(signal.Signals(n).name))
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    time.sleep(0.05)
open(sys.argv[1], "w").write(" ".join(got))
"""


def _counter(counted: Path, seconds: float) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _COUNTER, str(counted), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


@pytest.mark.multiproc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_pod_launcher_passes_on_one_sigusr1(tmp_path: Path, sig: signal.Signals) -> None:
    """A deleted pod (SIGTERM) and a Ctrl-C (SIGINT) reach mpirun as one SIGUSR1, which it passes on to every
    rank: its own stop on SIGTERM would SIGKILL the ranks 1 s later, and a second SIGINT at once."""
    counted = tmp_path / "signals"
    child = _counter(counted, 1.5)
    with stopping.forwarded_once(child, escalate_after=60) as sent:
        assert not sent.is_set()
        _signal_self(sig)
        assert sent.is_set()
        assert child.wait(timeout=10) == 0
    assert counted.read_text() == "SIGUSR1"


@pytest.mark.multiproc
def test_a_stop_noted_while_mpirun_starts_is_mpiruns_own_stop(tmp_path: Path) -> None:
    """A stop that came in the moment between the launcher's last look (pending()) and mpirun's start: mpirun
    may not handle SIGUSR1 yet (its default action would kill it) and has no ranks to pass it to: SIGTERM."""
    counted = tmp_path / "signals"
    with stopping.noted_early(stopping.STOP_SIGNALS):
        _signal_self(signal.SIGTERM)
        child = _counter(counted, 1.5)
        with stopping.forwarded_once(child, escalate_after=60) as sent:
            assert sent.is_set()
            assert child.wait(timeout=10) == 0
    assert counted.read_text() == "SIGTERM"


def test_a_launcher_stopped_before_mpirun_starts_does_not_start_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher is PID 1 of its pod, which ignores a SIGTERM it has no handler for: one that comes while it
    reads its config and hostfile is noted, mpirun never starts, and the termination log says why."""
    import argparse

    from mlbench_runner.pod import launch

    mpirun = tmp_path / "fake-mpirun"
    started = tmp_path / "mpirun-started"
    mpirun.write_text(f"#!{sys.executable}\nopen({str(started)!r}, 'w')\n")
    mpirun.chmod(0o755)
    (tmp_path / "config.json").write_text(make_config(logreg_task(), tmp_path / "out", 2).dump())
    (tmp_path / "hostfile").write_text("worker-0 slots=2\n")
    command = launch.mpirun_command

    def slow_set_up(**kwargs: Any) -> list[str]:
        _signal_self(signal.SIGTERM)  # the pod is deleted while the launcher sets up
        return command(**kwargs)

    monkeypatch.setattr(launch, "mpirun_command", slow_set_up)
    monkeypatch.setattr(launch, "gather", lambda *a, **k: pytest.fail("gathered results of a run never started"))
    parser = argparse.ArgumentParser()
    launch.add_launch_arguments(parser)
    argv = ["--config", str(tmp_path / "config.json"), "--hostfile", str(tmp_path / "hostfile")]
    argv += ["--mpirun", str(mpirun), "--termination-log", str(tmp_path / "termination-log")]
    before = signal.getsignal(signal.SIGTERM)
    assert launch.run_launch(parser.parse_args(argv)) == 128 + signal.SIGTERM
    assert not started.exists()
    message = json.loads((tmp_path / "termination-log").read_text())
    assert message == {"error": "stopped by SIGTERM before mpirun started", "exitCode": 143}
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.multiproc
@pytest.mark.parametrize(("first", "second"), [(signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGINT)])
def test_a_second_stop_signal_sends_mpiruns_sigterm_at_once(
    tmp_path: Path, first: signal.Signals, second: signal.Signals
) -> None:
    """A second Ctrl-C means "now": mpirun gets its SIGTERM without waiting out ``escalate_after``."""
    counted = tmp_path / "signals"
    child = _counter(counted, 1.5)
    with stopping.forwarded_once(child, escalate_after=60):
        _signal_self(first)
        time.sleep(0.2)  # the child takes its SIGUSR1 first
        _signal_self(second)
        assert child.wait(timeout=10) == 0
    assert counted.read_text() == "SIGUSR1 SIGTERM"


@pytest.mark.multiproc
def test_the_pod_launcher_escalates_to_sigterm_when_the_ranks_do_not_end(tmp_path: Path) -> None:
    counted = tmp_path / "signals"
    child = _counter(counted, 2.0)
    with stopping.forwarded_once(child, escalate_after=0.3):
        _signal_self(signal.SIGTERM)
        assert child.wait(timeout=10) == 0
    assert counted.read_text() == "SIGUSR1 SIGTERM"


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


@pytest.mark.multiproc
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
    cmd = [sys.executable, "-m", "mlbench_runner.tools.local", str(run), "--local", "--task-file", str(task)]
    cmd += ["--launcher", launcher, "--output-dir", str(out)]
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


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_deleted_launcher_pod_still_reports_the_aborted_summary(tmp_path: Path) -> None:
    """The kubelet's SIGTERM to the launcher (PID 1 of its pod): mpirun stops the ranks, the summary and the
    results line still come out, and the termination log says aborted/interrupted, exit 3."""
    if shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is not installed on this machine")
    from mlbench_runner.pod.launch import launcher_command
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


# --- the local command's stop: every descendant, whatever its process group


_ORPHAN_MAKER = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"],
    start_new_session=True,  # as mpirun gives each rank a process group of its own
)
print(grandchild.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.multiproc
def test_the_stop_reaches_descendants_in_other_process_groups() -> None:
    """A rank under mpirun is in a group of its own: neither its parent's group nor SIGTERM reaches it."""
    from mlbench_runner.tools import processes

    child = subprocess.Popen([sys.executable, "-c", _ORPHAN_MAKER], stdout=subprocess.PIPE, text=True, process_group=0)
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    try:
        processes.stop_processes([child], settle=0.0, grace=0.5)
        deadline = time.monotonic() + 10
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild), "the grandchild outlived the stop"
        assert child.poll() is not None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


@pytest.mark.multiproc
def test_the_processes_are_stopped_even_when_their_output_cannot_be_written() -> None:
    """After a Ctrl-C the output is still written; a closed terminal (EIO) there must not skip the stop."""
    from mlbench_runner.tools import processes

    chatty = (
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "while True:\n print(1, flush=True)\n time.sleep(0.05)"
    )
    proc = subprocess.Popen([sys.executable, "-c", chatty], stdout=subprocess.PIPE, text=True, process_group=0)
    streams = processes.Streams([proc])
    assert streams.next(timeout=30) == (0, "1")  # its SIGINT handler is set: the Ctrl-C will not end it

    def closed_terminal(line: str) -> None:
        raise OSError(5, "Input/output error")

    try:
        with pytest.raises(OSError, match="Input/output"), processes.stopped_on_exit([proc], streams, closed_terminal):
            raise KeyboardInterrupt
        assert proc.poll() is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_SLOW_TO_STOP = """
import os, signal, sys, time
rank = os.environ["OMPI_COMM_WORLD_RANK"]
def stop(signum, frame):
    time.sleep(3)  # a rank busy in a long kernel or a collective before it can write its summary
    open(os.path.join(sys.argv[1], "stopped-" + rank), "w").write(signal.Signals(signum).name)
    sys.exit(3)
for sig in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(sig, stop)
open(os.path.join(sys.argv[1], "ready-" + rank), "w").close()
time.sleep(120)
"""


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mpirun_gives_a_stopped_rank_time_to_write_its_summary(tmp_path: Path) -> None:
    """mpirun's own stop SIGKILLs a rank 1 s after its SIGTERM: too short for a rank inside a long C call. The
    launcher's SIGUSR1, which mpirun passes on, lets each end on its own."""
    if shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is not installed on this machine")
    from mlbench_runner.pod.launch import launcher_command
    from mlbench_runner.world import free_port

    out = tmp_path / "launch"
    out.mkdir()
    task = logreg_task()
    task["runner"]["command"] = [sys.executable, "-c", _SLOW_TO_STOP, str(out)]
    (out / "config.json").write_text(make_config(task, out, 2).dump())
    (out / "hostfile").write_text("localhost slots=2\n")
    cmd = launcher_command(out / "config.json", out / "hostfile", out / "termination-log", oversubscribe=True)
    with (tmp_path / "launcher.log").open("w") as log:
        proc = subprocess.Popen(
            cmd,
            env=env(MASTER_PORT=str(free_port())),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("ready-*"))) < 2:
            assert proc.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # the kubelet, to the launcher pod's PID 1
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stopped = sorted(p.name for p in out.glob("stopped-*"))
    assert stopped == ["stopped-0", "stopped-1"], (tmp_path / "launcher.log").read_text()[-3000:]
    assert (out / "stopped-0").read_text() == "SIGUSR1"


@pytest.mark.multiproc
def test_a_mangled_summary_line_falls_back_to_worker_0s_summary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a pod the ranks' output folder is on worker 0: the summary comes from there (fetched over ssh)."""
    import argparse

    from mlbench_runner.pod import launch

    summary = factories.summary("t", world_size=2)
    line = json.dumps({"rank": 0, "summary": json.loads(summary.termination_message()), "event": "run_summary"})
    mangled = "[1,0]<stdout>:" + line.replace('"status"', '"sta[1,1]<stdout>:tus"', 1)
    mpirun = tmp_path / "fake-mpirun"
    mpirun.write_text(f"#!{sys.executable}\nprint({mangled!r})\n")
    mpirun.chmod(0o755)
    out = tmp_path / "worker-0-only"  # not on the launcher: the local fallback finds nothing
    (tmp_path / "config.json").write_text(make_config(logreg_task(), out, 2).dump())
    (tmp_path / "hostfile").write_text("worker-0 slots=2\n")
    fetched = summary.model_dump_json(by_alias=True).encode()
    monkeypatch.setattr(launch, "gather", lambda *a, **k: {bundle.SUMMARY: fetched})
    parser = argparse.ArgumentParser()
    launch.add_launch_arguments(parser)
    argv = ["--config", str(tmp_path / "config.json"), "--hostfile", str(tmp_path / "hostfile")]
    argv += ["--mpirun", str(mpirun), "--termination-log", str(tmp_path / "termination-log")]
    args = parser.parse_args(argv)
    assert launch.run_launch(args) == 0
    assert RunSummary.from_termination_message(
        (tmp_path / "termination-log").read_text()
    ) == RunSummary.from_termination_message(summary.termination_message())


@pytest.mark.multiproc
def test_the_tree_is_taken_from_running_processes_only() -> None:
    """A reaped process's pid may be another's by now: its children are not ours to kill."""
    from mlbench_runner.tools import processes

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:

        class Reaped:
            pid = os.getpid()  # a pid that has children (``child``), as a reused one may
            returncode = 0

        class Running:
            pid = os.getpid()
            returncode = None

        assert processes.process_tree([Reaped()]) == set()  # type: ignore[list-item]
        assert child.pid in {pid for pid, _ in processes.process_tree([Running()])}  # type: ignore[list-item]
    finally:
        child.kill()
        child.wait()


_MPIRUN_WHOSE_RANK_0_SAW_A_PEER_LEAVE = """
import json, signal, sys, time
def stop(signum, frame):  # rank 0's collective broke when rank 1 took the stop first: it says error
    print("[1,0]<stdout>:" + json.dumps({"rank": 0, "summary": SUMMARY, "event": "run_summary"}), flush=True)
    sys.exit(3)
signal.signal(signal.SIGUSR1, stop)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.multiproc
def test_a_stopped_launcher_reports_interrupted_even_when_rank_0_saw_a_peer_leave_first(tmp_path: Path) -> None:
    """The operator restarts an interrupted run (a lost pod) but not an aborted one: the launcher knows it was
    stopped, whatever rank 0 concluded from a broken collective."""
    from mlbench_runner.pod.launch import launcher_command

    said = factories.summary("t").model_copy(
        update={"status": "aborted", "goal_reached": False, "stop_reason": "error"}
    )
    mpirun = tmp_path / "fake-mpirun"
    script = _MPIRUN_WHOSE_RANK_0_SAW_A_PEER_LEAVE.replace("SUMMARY", repr(json.loads(said.termination_message())))
    mpirun.write_text(f"#!{sys.executable}\n{script}")
    mpirun.chmod(0o755)
    (tmp_path / "config.json").write_text(make_config(logreg_task(), tmp_path / "out", 2).dump())
    (tmp_path / "hostfile").write_text("worker-0.invalid slots=2\n")  # nothing to fetch from
    cmd = launcher_command(
        tmp_path / "config.json", tmp_path / "hostfile", tmp_path / "termination-log", oversubscribe=True
    )
    with (tmp_path / "launcher.log").open("w") as log:
        proc = subprocess.Popen([*cmd, "--mpirun", str(mpirun)], env=env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "ready" not in (tmp_path / "launcher.log").read_text():
            assert proc.poll() is None, (tmp_path / "launcher.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 3, (tmp_path / "launcher.log").read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reported = RunSummary.from_termination_message((tmp_path / "termination-log").read_text())
    assert (reported.status, reported.stop_reason) == ("aborted", "interrupted")


@pytest.mark.multiproc
def test_after_one_rank_fails_the_others_get_time_to_fail_on_their_own(tmp_path: Path) -> None:
    """A rank's exit breaks its peers' collectives within moments, and they stop with stop reason error; a
    SIGTERM at once would make them say interrupted instead (the process launcher of ``mlbench run --local``)."""
    from mlbench_runner.tools import processes

    marker = str(tmp_path / "terminated")
    rank = (
        "import os, signal, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    sys.exit(1)  # crashes at once\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (open({marker!r}, 'w').close(), sys.exit(143)))\n"
        "time.sleep(1)  # then its collective breaks: it fails on its own\n"
        "sys.exit(1)\n"
    )
    code = processes.run_processes(tmp_path / "config.json", 2, env(), lambda line: None, (sys.executable, "-c", rank))
    assert code == 1
    assert not (tmp_path / "terminated").exists()


@pytest.mark.multiproc
def test_output_that_is_not_utf8_is_read_not_a_crash(tmp_path: Path) -> None:
    """mpirun tags each piece it reads, so a tag can split a multi-byte character (a progress bar's block)."""
    from mlbench_runner.pod import launch

    lines: list[str] = []
    raw = b"[1,0]<stdout>:caf\xc3[1,0]<stdout>:\xa9 ok\n[1,0]<stdout>:next\n"
    printer = tmp_path / "printer"
    printer.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.buffer.write({raw!r})\n")
    printer.chmod(0o755)
    assert launch.stream([str(printer)], lines.append).code == 0
    assert len(lines) == 2
    assert lines[1] == "[1,0]<stdout>:next"


@pytest.mark.multiproc
@pytest.mark.parametrize("broken", [b"{}", b"\xff{ not utf-8"])
def test_a_broken_local_summary_file_is_an_error_message_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: bytes
) -> None:
    """An open-division program left a summary.json that is no RunSummary, and printed none: the launcher writes
    its error object (the run fails with the launcher's reason), it does not die with a traceback."""
    import argparse

    from mlbench_runner.pod import launch

    mpirun = tmp_path / "fake-mpirun"
    mpirun.write_text(f"#!{sys.executable}\nprint('no summary here')\n")
    mpirun.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_bytes(broken)
    (tmp_path / "config.json").write_text(make_config(logreg_task(), out, 2).dump())
    (tmp_path / "hostfile").write_text("worker-0 slots=2\n")
    monkeypatch.setattr(launch, "gather", lambda *a, **k: {})
    parser = argparse.ArgumentParser()
    launch.add_launch_arguments(parser)
    argv = ["--config", str(tmp_path / "config.json"), "--hostfile", str(tmp_path / "hostfile")]
    argv += ["--mpirun", str(mpirun), "--termination-log", str(tmp_path / "termination-log")]
    code = launch.run_launch(parser.parse_args(argv))
    assert code != 0
    assert "error" in json.loads((tmp_path / "termination-log").read_text())
