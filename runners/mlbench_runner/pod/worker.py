"""The worker pod's entrypoint: sshd for ``mpirun``, and the one witness of a rank's OOM kill.

Ranks are not the container's main process: the launcher's ``mpirun`` starts them over ssh,
so they live in the worker's cgroup as children of sshd. When one of them outgrows the
container's memory limit the kernel kills *it*, sshd survives, the container keeps running,
and Kubernetes never reports ``OOMKilled``: the run would fail as a vague launcher error.
``mlbench-runner worker -- sshd ...`` therefore runs sshd as a child and watches the cgroup's OOM-kill
counter (``memory.events`` on cgroup v2, ``memory.oom_control`` on v1). When it rises the
worker writes the cause to its termination log and exits 137, so the pod fails with the
container runtime's own reason ``OOMKilled`` and the operator names the worker and the limit.

The same holds for the kubelet's stop (a deleted, evicted or preempted pod): SIGTERM reaches only
this process, and sshd, told to stop, exits 0 while the ranks under its sessions run on until the
container's end kills them. So a stop signal goes first to the ranks (every process below the worker
but sshd, its sessions' shells and Open MPI's daemon, the *carriers*: the daemon forwards a rank's
last words and reports its exit, and a closed session makes mpirun drop the node), which take it as
their graceful stop; after they have ended, or :data:`STOP_WAIT_SECONDS`, the carriers get it too,
and the worker exits 128 + the signal with the cause in its termination log: the pod reads as
stopped, not as ``Completed``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlbench_api.contract import TERMINATION_LOG
from mlbench_runner import stopping
from mlbench_runner.processtable import Process, descendants, process_table

#: Where cgroup v2 and v1 keep the memory controller's OOM-kill counter (the container's own cgroup).
OOM_COUNTERS = (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control"))
#: Where the matching memory limit is (same order as :data:`OOM_COUNTERS`).
MEMORY_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
POLL_SECONDS = 0.5
EXIT_OOM = 137  # 128 + SIGKILL: what a shell reports for an OOM-killed process
#: How long a stopped worker waits for the processes below it (the pod's grace period is 30 s by default).
STOP_WAIT_SECONDS = 20.0


def parse_oom_kills(text: str) -> int | None:
    """The ``oom_kill N`` line of ``memory.events`` / ``memory.oom_control``; None if absent."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value.strip())
    return None


def read_oom_kills(counters: Sequence[Path] = OOM_COUNTERS) -> int | None:
    """This container's OOM kills so far, or None where no counter is readable (then we only run sshd)."""
    for path in counters:
        try:
            value = parse_oom_kills(path.read_text())
        except OSError:
            continue
        if value is not None:
            return value
    return None


def memory_limit(limits: Sequence[Path] = MEMORY_LIMITS) -> int | None:
    """The container's memory limit in bytes; None when unlimited or unreadable."""
    for path in limits:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit() or int(text) >= 1 << 60:  # v1 says "unlimited" with a huge number
            return None
        return int(text)
    return None


def oom_message(worker: str, kills: int, limit: int | None) -> str:
    """The termination message: which worker, how many processes, and the limit to raise."""
    where = f"worker {worker}" if worker else "this worker"
    cap = f" of {limit / 2**20:.0f} MiB" if limit else ""
    return (
        f"OOMKilled: the kernel killed {kills} process(es) in {where} for exceeding its memory limit{cap}; "
        "raise spec.resources.memory"
    )


#: The processes between the worker and a rank (``/proc/PID/stat``'s command names): sshd and its sessions, the
#: shell a session runs a command in, and Open MPI's per-node daemon (orted; prted from Open MPI 5).
CARRIERS = frozenset({"sshd", "sshd-session", "sh", "bash", "dash", "orted", "prted"})


def ranks_below(table: Mapping[int, Process], root: int) -> list[int]:
    """The processes below ``root`` a stop reaches first: all but the :data:`CARRIERS` (the ranks, and what
    they started)."""
    return [pid for pid in descendants(table, root) if table[pid].command not in CARRIERS]


def alive(table: Mapping[int, Process], pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` still running (in ``table`` and not zombies)."""
    return [pid for pid in pids if pid in table and table[pid].state != "Z"]


def stop_message(worker: str, signum: int) -> str:
    """The termination message of a worker stopped by ``signum``."""
    where = f"worker {worker}" if worker else "this worker"
    name = signal.Signals(signum).name
    return (
        f"{where} was stopped by {name} (the kubelet's stop: the pod was deleted, evicted or preempted, or its "
        f"node drained); the ranks under sshd got {name} first, then sshd"
    )


def _signal_all(pids: Iterable[int], signum: int) -> None:
    """``signum`` to each of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _reap() -> None:
    """Collect ended children: as a container's PID 1 the worker inherits every orphaned rank."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _wait_gone(pids: Iterable[int], seconds: float, poll: float) -> None:
    """Wait up to ``seconds`` until none of ``pids`` runs any more."""
    end = time.monotonic() + seconds
    while alive(process_table(), pids) and time.monotonic() < end:
        _reap()
        time.sleep(poll)


@dataclass
class Stop:
    """A stop in progress: its first signal, and the ranks it reached (each later signal may add some)."""

    signum: int | None = None
    ranks: set[int] = field(default_factory=set)

    def take(self, signum: int) -> None:
        """A stop signal came (a handler): pass it on to the ranks below this process at once."""
        if self.signum is None:
            self.signum = signum
        ranks = ranks_below(process_table(), os.getpid())
        self.ranks.update(ranks)
        _signal_all(ranks, signum)

    def finish(self, child: subprocess.Popen[bytes], poll: float) -> None:
        """After the ranks' graceful stop (at most :data:`STOP_WAIT_SECONDS`), stop the carriers and sshd."""
        assert self.signum is not None
        _wait_gone(self.ranks, STOP_WAIT_SECONDS, poll)
        _signal_all(descendants(process_table(), os.getpid()), self.signum)  # sshd too, unless it has ended
        try:
            child.wait(timeout=STOP_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def supervise(
    argv: Sequence[str],
    *,
    termination_log: str = TERMINATION_LOG,
    counters: Sequence[Path] = OOM_COUNTERS,
    limits: Sequence[Path] = MEMORY_LIMITS,
    worker: str = "",
    poll: float = POLL_SECONDS,
) -> int:
    """Run ``argv`` until it exits (its code), an OOM kill happens in this cgroup (137) or a stop signal comes
    (128 + the signal, after the ranks' graceful stop and then sshd's: :class:`Stop`)."""
    baseline = read_oom_kills(counters) or 0
    stop = Stop()
    # before the child exists: PID 1 ignores unhandled signals; the kubelet's stop, or a Ctrl-C outside a pod
    with stopping.handlers(stopping.STOP_SIGNALS, lambda signum, _frame: stop.take(signum)):
        child = subprocess.Popen(list(argv))
        while True:
            try:
                code = child.wait(timeout=poll)
            except subprocess.TimeoutExpired:
                code = None
            if stop.signum is not None:
                stop.finish(child, poll)
                message = stop_message(worker, stop.signum)
                print(message, file=sys.stderr, flush=True)
                _write(termination_log, message)
                return 128 + stop.signum
            kills = read_oom_kills(counters)
            if kills is not None and kills > baseline:  # also when the child itself was the one killed
                message = oom_message(worker, kills - baseline, memory_limit(limits))
                print(message, file=sys.stderr, flush=True)
                _write(termination_log, message)
                if code is None:
                    child.kill()
                    child.wait()
                return EXIT_OOM
            if code is not None:
                return code if code >= 0 else 128 - code


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as exc:  # outside Kubernetes there is no termination log: stderr already has it
        print(f"cannot write termination log {path}: {exc}", file=sys.stderr)


def run_worker(argv: Sequence[str]) -> int:
    """``mlbench-runner worker -- CMD...``: run the worker's sshd (CMD), OOM-watched."""
    if not argv:
        print("error: mlbench-runner worker needs the command to supervise after --", file=sys.stderr)
        return 2
    started = time.monotonic()
    code = supervise(argv, worker=os.environ.get("POD_NAME", ""))
    print(f"worker exits with {code} after {time.monotonic() - started:.0f}s", file=sys.stderr)
    return code
