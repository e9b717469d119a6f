"""Who am I in the job: rank, size, local rank and the rendezvous address.

Under ``mpirun`` (OpenMPI) the rank comes from ``OMPI_COMM_WORLD_*`` and the rendezvous
host is the first host of the hostfile (``MLBENCH_HOSTFILE``, default
``/etc/mlbench/hostfile``) unless ``MASTER_ADDR`` is set. A local launch sets the usual
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``. No variables at all
means a single process.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOSTFILE = "/etc/mlbench/hostfile"
DEFAULT_PORT = 29500


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a local rendezvous; racy by nature, fine for one machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    master_addr: str
    master_port: int
    launcher: str  # "mpirun", "env" or "single"


def parse_hostfile(path: str | Path) -> list[tuple[str, int]]:
    """``<host> slots=<n>`` lines (comments and blank lines ignored) as (host, slots)."""
    hosts: list[tuple[str, int]] = []
    for lineno, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        slots = 1
        for option in fields[1:]:
            key, _, value = option.partition("=")
            if key == "slots":
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"hostfile {path}:{lineno}: slots must be a positive integer, got {value!r}")
                slots = int(value)
        hosts.append((fields[0], slots))
    if not hosts:
        raise ValueError(f"hostfile {path}: no hosts")
    return hosts


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None:
        if default is None:
            raise ValueError(f"{name} is not set")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def detect_world(env: Mapping[str, str] | None = None) -> World:
    """Read the launcher's environment (see the module docstring)."""
    env = os.environ if env is None else env
    port = _int(env, "MASTER_PORT", DEFAULT_PORT)
    if "OMPI_COMM_WORLD_RANK" in env:
        addr = env.get("MASTER_ADDR")
        if not addr:
            hostfile = env.get("MLBENCH_HOSTFILE", DEFAULT_HOSTFILE)
            addr = parse_hostfile(hostfile)[0][0] if Path(hostfile).exists() else "127.0.0.1"
        size = _int(env, "OMPI_COMM_WORLD_SIZE")
        return World(
            rank=_int(env, "OMPI_COMM_WORLD_RANK"),
            size=size,
            local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
            local_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", size),
            master_addr=addr,
            master_port=port,
            launcher="mpirun",
        )
    if "RANK" in env or "WORLD_SIZE" in env:
        size = _int(env, "WORLD_SIZE", 1)
        return World(
            rank=_int(env, "RANK", 0),
            size=size,
            local_rank=_int(env, "LOCAL_RANK", 0),
            local_size=_int(env, "LOCAL_WORLD_SIZE", size),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=port,
            launcher="env",
        )
    return World(0, 1, 0, 1, env.get("MASTER_ADDR", "127.0.0.1"), port, "single")
