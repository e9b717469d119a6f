"""A local run's processes (the ranks, or the launcher and its mpirun): started in groups of their own, their
output merged line by line (:class:`Streams`), and stopped with every descendant however the command ends
(:func:`stopped_on_exit`, :func:`stop_processes`; the tree from /proc: :func:`process_tree`, through
:mod:`mlbench_runner.processtable`)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import mlbench_api
import mlbench_runner
from mlbench_api.task import RUNNER_ENTRYPOINT
from mlbench_runner import stopping
from mlbench_runner.pod.launch import launcher_command, rank_command
from mlbench_runner.processtable import descendants, process_table, read_process
from mlbench_runner.world import free_port


def importable_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with PYTHONPATH covering where mlbench_runner and mlbench_api were imported from,
    so child ranks find them without an install (a no-op for an installed package)."""
    roots = [str(Path(m.__file__).resolve().parent.parent) for m in (mlbench_runner, mlbench_api) if m.__file__]
    existing = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots + existing))
    return env


class Streams:
    """The merged output lines of ``procs``, each read by a thread of its own: a pipe never fills (and blocks
    its writer) while this command waits, and after a Ctrl-C the lines the processes print as they stop
    (their ``run_stop``, the launcher's results) still reach ``output.log``."""

    def __init__(self, procs: Sequence[subprocess.Popen[str]]) -> None:
        self.open = len(procs)
        self._lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
        for tag, proc in enumerate(procs):
            threading.Thread(target=self._pump, args=(proc, tag), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str], tag: int) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put((tag, line.rstrip("\n")))
        self._lines.put((tag, None))

    def next(self, timeout: float | None = None) -> tuple[int, str | None]:
        """(process index, line), or (index, None) when that process closed its output; raises ``queue.Empty``
        after ``timeout`` seconds."""
        tag, line = self._lines.get(timeout=timeout)
        if line is None:
            self.open -= 1
        return tag, line

    def drain(self, on_line: Any, seconds: float, cut: threading.Event) -> bool:
        """Hand lines to ``on_line`` until every output is closed, ``seconds`` have passed or ``cut`` is set
        (then it is cleared); whether every output was closed."""
        deadline = time.monotonic() + seconds
        while self.open and (left := deadline - time.monotonic()) > 0 and not _used(cut):
            with contextlib.suppress(queue.Empty):
                if (line := self.next(timeout=min(POLL_SECONDS, left))[1]) is not None:
                    on_line(line)
        return not self.open


def start_child(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """A rank or the launcher: output merged and line by line; a process group of its own, so that a terminal's
    Ctrl-C reaches only this command, which passes it on once; no stdin, which a background group would be
    stopped for reading from the terminal (SIGTTIN; mpirun reads it to forward to rank 0)."""
    return subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",  # a rank's bytes that are not UTF-8 (or a tag inside a character) are no crash
        env=env,
        bufsize=1,
        process_group=0,
    )


def run_processes(
    config_path: Path,
    ranks: int,
    env: dict[str, str],
    on_line: Any,
    command: Sequence[str] = (RUNNER_ENTRYPOINT, "train"),
) -> int:
    """Start ``ranks`` processes of the task's ``runner.command`` with torch-style env; stop all if one fails."""
    port = str(free_port())
    argv = rank_command(command, str(config_path))
    procs = []
    for r in range(ranks):
        penv = dict(
            env,
            RANK=str(r),
            WORLD_SIZE=str(ranks),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(ranks),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        procs.append(start_child(argv, penv))
    streams, failed = Streams(procs), 0
    stragglers = threading.Timer(FAILURE_GRACE_SECONDS, _terminate_running, (procs,))
    stragglers.daemon = True
    try:
        with stopped_on_exit(procs, streams, on_line):
            while streams.open:
                tag, line = streams.next()
                if line is None:
                    code = procs[tag].wait()
                    if code != 0 and not failed:
                        failed = code
                        stragglers.start()
                    continue
                on_line(line)
    finally:
        stragglers.cancel()
    return failed or max(p.wait() for p in procs)


#: Seconds the other ranks get to end on their own after one failed, before they are terminated: the failed
#: rank's exit breaks their collectives, so they stop by themselves with stop reason ``error`` (terminated,
#: they would say ``interrupted``).
FAILURE_GRACE_SECONDS = 5.0


def _terminate_running(procs: Sequence[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()


#: Seconds the ranks get to end on their own after a Ctrl-C before they are terminated: each takes the one
#: SIGINT this command passes on (:mod:`mlbench_runner.stopping`), writes its ``aborted`` summary and leaves.
SETTLE_SECONDS = 10.0


#: How often a stop looks at its processes and at a further Ctrl-C.
POLL_SECONDS = 0.05


def _used(cut: threading.Event) -> bool:
    """Whether a stop signal was noted since the last look (and clear it: one signal cuts one wait)."""
    if cut.is_set():
        cut.clear()
        return True
    return False


def _wait_all(procs: Sequence[subprocess.Popen[str]], seconds: float, cut: threading.Event) -> None:
    """Until every process has ended, ``seconds`` have passed, or a further stop signal is noted in ``cut``."""
    deadline = time.monotonic() + seconds
    while any(p.poll() is None for p in procs) and (left := deadline - time.monotonic()) > 0 and not _used(cut):
        time.sleep(min(POLL_SECONDS, left))


#: A process as found in /proc: (pid, start time in clock ticks), so that a pid reused since is never signalled.
ProcessId = tuple[int, int]


def process_tree(procs: Sequence[subprocess.Popen[str]]) -> set[ProcessId]:
    """Every live descendant of the running ``procs`` (Linux /proc; a reaped one's pid may be another process's
    by now). Neither the process group nor the parent reaches them all: mpirun gives each rank a group of its
    own, and a child whose parent died is re-parented to init, so the tree is taken while the parents live."""
    table = process_table()
    roots = [p.pid for p in procs if p.returncode is None]  # unreaped (a zombie keeps its pid): still ours
    return {(pid, table[pid].started) for root in roots for pid in descendants(table, root)}


def kill_tree(tree: set[ProcessId]) -> None:
    """SIGKILL each process of ``tree`` that still runs as the same process (its start time unchanged)."""
    for pid, start in tree:
        now = read_process(pid)
        if now is not None and now.started == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def stop_processes(
    procs: Sequence[subprocess.Popen[str]],
    settle: float = 0.0,
    grace: float = 5.0,
    tree: set[ProcessId] | frozenset[ProcessId] = frozenset(),
) -> None:
    """Let the processes end on their own for ``settle`` seconds, then terminate those still running (the
    process itself: a rank, or the launcher, which takes a second stop as "now" and passes mpirun its
    SIGTERM), and after ``grace`` seconds more kill them and every descendant (``tree``: taken earlier,
    plus those found now). Another Ctrl-C cuts a wait short, never the stop: no rank may outlive the command."""
    with stopping.noted() as cut:
        tree = set(tree) | process_tree(procs)  # before the wait reaps any: an orphan's parent is then unknown
        _wait_all(procs, settle, cut)
        tree |= process_tree(procs)
        _terminate_running(procs)
        _wait_all(procs, grace, cut)
        tree |= process_tree(procs)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        kill_tree(tree)
        for proc in procs:
            proc.wait()


@contextlib.contextmanager
def stopped_on_exit(procs: Sequence[subprocess.Popen[str]], streams: Streams, on_line: Any) -> Iterator[None]:
    """No process of ``procs`` (nor any of theirs) outlives a block that raises: after a Ctrl-C each gets one
    SIGINT and :data:`SETTLE_SECONDS` to write its summary and end, its output still handed to ``on_line``
    (another Ctrl-C cuts that short); after any other error they are stopped at once."""
    try:
        yield
    except KeyboardInterrupt:
        with stopping.noted() as cut:
            tree, started, settle = process_tree(procs), time.monotonic(), 0.0
            for proc in procs:  # the process itself: the pod launcher passes it on to mpirun as one SIGUSR1
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGINT)
            try:
                if streams.drain(on_line, SETTLE_SECONDS, cut):  # outputs closed: wait for the exits
                    settle = max(0.0, SETTLE_SECONDS - (time.monotonic() - started))
            finally:  # also when on_line fails (a closed terminal, a full disk)
                stop_processes(procs, settle=settle, tree=tree)
        raise
    except BaseException:
        stop_processes(procs)
        raise


def run_mpirun(config_path: Path, out: Path, ranks: int, env: dict[str, str], on_line: Any) -> int:
    """Through ``mlbench-runner launch`` with a localhost hostfile, as the launcher pod does."""
    hostfile = out / "hostfile"
    hostfile.write_text(f"localhost slots={ranks}\n")
    env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), MLBENCH_HOSTFILE=str(hostfile))
    cmd = launcher_command(config_path, hostfile, out / "termination-log", oversubscribe=True)
    proc = start_child(cmd, env)
    streams = Streams([proc])
    with stopped_on_exit([proc], streams, on_line):  # the launcher passes a SIGINT on to mpirun as SIGUSR1
        while streams.open:
            if (line := streams.next()[1]) is not None:
                on_line(line)
    return proc.wait()
