"""The launcher's last act: gather rank 0's full results and print them as one log line.

Rank 0's ``summary.json`` and ``events.jsonl`` live in worker 0's emptyDir, which the run's cleanup
deletes; the operator keeps what the launcher prints (see :mod:`mlbench_api.bundle`). The launcher
reads the files where rank 0 wrote them: in its own output directory when rank 0 ran on this
machine (local runs, tests), else over the ssh it already uses for ``mpirun``. What cannot be read
(worker 0 gone, no summary because the run crashed) falls back to what the launcher saw on
``mpirun``'s output: rank 0's event lines and the compact ``run_summary``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from mlbench_api import bundle
from mlbench_api.results import RunSummary

#: Per file: the operator waits at most 60 s for a launcher that is still running (results.WAIT_SECONDS).
SSH_TIMEOUT_SECONDS = 15


def ssh_options(port: int, key: str | None) -> list[str]:
    """The ssh options of ``mpirun``'s ``plm_rsh_args`` (workers' host keys are per pod: not checked)."""
    opts = ["-p", str(port), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    opts += ["-o", "LogLevel=ERROR"]
    return [*opts, "-i", key] if key else opts


def read_remote(host: str, path: str, port: int, key: str | None, timeout: float = SSH_TIMEOUT_SECONDS) -> bytes | None:
    """``cat path`` on ``host`` over ssh; None when it fails (no such file, host gone)."""
    cmd = ["ssh", *ssh_options(port, key), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", host, "cat", path]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def rank0_event(text: str) -> str | None:
    """``text`` (an output line, mpirun's tag already stripped) if it is one of rank 0's event lines."""
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or "event" not in data or data.get("rank") != 0:
        return None
    return text


def gather(
    output_dir: str,
    config_path: str,
    host: str | None,
    *,
    ssh_port: int,
    ssh_key: str | None,
    seen_events: Sequence[str],
    seen_summary: RunSummary | None,
) -> dict[str, bytes]:
    """summary.json, events.jsonl and config.json, each from the best source there is."""
    files: dict[str, bytes] = {}
    for name in (bundle.SUMMARY, bundle.EVENTS):
        local = Path(output_dir, name)
        data = local.read_bytes() if local.is_file() else None
        if data is None and host is not None:
            data = read_remote(host, f"{output_dir}/{name}", ssh_port, ssh_key)
        if data:
            files[name] = data
    if bundle.SUMMARY not in files and seen_summary is not None:
        files[bundle.SUMMARY] = seen_summary.model_dump_json(by_alias=True, exclude_none=True).encode()
    if bundle.EVENTS not in files and seen_events:
        files[bundle.EVENTS] = "".join(line + "\n" for line in seen_events).encode()
    with contextlib.suppress(OSError):  # the ConfigMap volume; absent only in odd tests
        files[bundle.CONFIG] = Path(config_path).read_bytes()
    return files


def results_line(files: dict[str, bytes]) -> str | None:
    """The ``run_results`` line for ``files`` (cut to the ConfigMap budget); None if nothing fits."""
    if not files:
        return None
    try:
        return bundle.results_line(bundle.fit(files))
    except bundle.BundleError:
        return None
