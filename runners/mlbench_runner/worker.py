"""The worker pod's entrypoint: sshd for ``mpirun``, and the one witness of a rank's OOM kill.

Ranks are not the container's main process: the launcher's ``mpirun`` starts them over ssh,
so they live in the worker's cgroup as children of sshd. When one of them outgrows the
container's memory limit the kernel kills *it*, sshd survives, the container keeps running,
and Kubernetes never reports ``OOMKilled``: the run would fail as a vague launcher error.
``mlbench-runner worker -- sshd ...`` therefore runs sshd as a child and watches the cgroup's OOM-kill
counter (``memory.events`` on cgroup v2, ``memory.oom_control`` on v1). When it rises the
worker writes the cause to its termination log and exits 137, so the pod fails with the
container runtime's own reason ``OOMKilled`` and the operator names the worker and the limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
#: Where cgroup v2 and v1 keep the memory controller's OOM-kill counter (the container's own cgroup).
OOM_COUNTERS = (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control"))
#: Where the matching memory limit is (same order as :data:`OOM_COUNTERS`).
MEMORY_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
POLL_SECONDS = 0.5
EXIT_OOM = 137  # 128 + SIGKILL: what a shell reports for an OOM-killed process


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


def supervise(
    argv: Sequence[str],
    *,
    termination_log: str = DEFAULT_TERMINATION_LOG,
    counters: Sequence[Path] = OOM_COUNTERS,
    limits: Sequence[Path] = MEMORY_LIMITS,
    worker: str = "",
    poll: float = POLL_SECONDS,
) -> int:
    """Run ``argv`` until it exits (its code) or an OOM kill happens in this cgroup (137)."""
    baseline = read_oom_kills(counters) or 0
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        if child is not None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):  # before the child exists: PID 1 ignores unhandled signals
        signal.signal(sig, forward)
    child = subprocess.Popen(list(argv))
    while True:
        try:
            code = child.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            code = None
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
