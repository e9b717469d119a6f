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
from mlbench_api.network import NetworkConditions
from mlbench_api.results import RunSummary

#: Per file: the operator waits at most 60 s for a launcher that is still running (results.WAIT_SECONDS).
SSH_TIMEOUT_SECONDS = 15
#: mpirun's ssh: a worker that does not answer the TCP handshake and key exchange in time fails the
#: launch (named: "Connection timed out") instead of hanging it; an established session whose
#: worker stops answering (its node is gone, no RST) ends after SERVER_ALIVE_INTERVAL * COUNT_MAX.
CONNECT_TIMEOUT_SECONDS = 10
SERVER_ALIVE_INTERVAL = 15
SERVER_ALIVE_COUNT_MAX = 4


def handshake_delay(network: NetworkConditions | None) -> int:
    """Seconds an emulated network (spec.network) adds to an ssh handshake; 0 without one."""
    return 0 if network is None else network.ssh_handshake_delay()


def ssh_options(
    port: int,
    key: str | None,
    known_hosts: str | None = None,
    host_key_alias: str | None = None,
    *,
    connect_timeout: int = CONNECT_TIMEOUT_SECONDS,
) -> list[str]:
    """The ssh options of ``mpirun``'s ``plm_rsh_args`` (and of reading rank 0's files).

    With ``known_hosts`` (the operator always gives one: the run's host key, under
    ``host_key_alias``): strict host key checking against that file only; a worker presenting any
    other key fails with "Host key verification failed". Without one (local runs, hand-made
    hostfiles) the runner cannot know what to expect, and host keys are not checked, as before:
    ssh's defaults would instead prompt (no tty: fail) or write ``~/.ssh/known_hosts``.
    ssh takes the first value of an option, so callers cannot override these by appending.
    """
    opts = ["-p", str(port)]
    if known_hosts:
        opts += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}"]
        opts += ["-o", "GlobalKnownHostsFile=/dev/null", "-o", "CheckHostIP=no"]
        if host_key_alias:
            opts += ["-o", f"HostKeyAlias={host_key_alias}"]
    else:
        opts += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    opts += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}"]
    opts += ["-o", f"ServerAliveInterval={SERVER_ALIVE_INTERVAL}"]
    opts += ["-o", f"ServerAliveCountMax={SERVER_ALIVE_COUNT_MAX}", "-o", "LogLevel=ERROR"]
    return [*opts, "-o", "IdentitiesOnly=yes", "-i", key] if key else opts


def read_remote(
    host: str,
    path: str,
    port: int,
    key: str | None,
    timeout: float = SSH_TIMEOUT_SECONDS,
    *,
    known_hosts: str | None = None,
    host_key_alias: str | None = None,
    delay: int = 0,
) -> bytes | None:
    """``cat path`` on ``host`` over ssh; None when it fails (no such file, host gone, wrong host key). ``delay``:
    :func:`handshake_delay`, added to both timeouts."""
    opts = ssh_options(port, key, known_hosts, host_key_alias, connect_timeout=5 + delay)
    timeout += delay
    cmd = ["ssh", *opts, host, "cat", path]
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
    ssh_known_hosts: str | None = None,
    ssh_host_key_alias: str | None = None,
    delay: int = 0,
) -> dict[str, bytes]:
    """summary.json, events.jsonl and config.json, each from the best source there is (``delay``: the emulated
    network's, :func:`handshake_delay`)."""
    files: dict[str, bytes] = {}
    for name in (bundle.SUMMARY, bundle.EVENTS):
        local = Path(output_dir, name)
        data = local.read_bytes() if local.is_file() else None
        if data is None and host is not None:
            data = read_remote(
                host,
                f"{output_dir}/{name}",
                ssh_port,
                ssh_key,
                known_hosts=ssh_known_hosts,
                host_key_alias=ssh_host_key_alias,
                delay=delay,
            )
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
