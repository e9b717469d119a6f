"""Who am I in the job: rank, size, local rank and the rendezvous address.

Under ``mpirun`` (OpenMPI) the rank comes from ``OMPI_COMM_WORLD_*`` and the rendezvous
host is the first host of the hostfile (``MLBENCH_HOSTFILE``, default
``/etc/mlbench/hostfile``) unless ``MASTER_ADDR`` is set. A local launch sets the usual
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``. No variables at all
means a single process.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mlbench_api.contract import ENV_HOSTFILE, ENV_NODE_NAME, HOSTFILE_PATH

DEFAULT_PORT = 29500


#: Where Linux hands out ports by itself (``bind`` to port 0, outgoing connections) unless configured otherwise.
DEFAULT_EPHEMERAL_PORTS = range(32768, 61000)
EPHEMERAL_PORTS_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port chosen for a rendezvous (well above the usual services).
LOWEST_CHOSEN_PORT = 20000
#: Fewer free ports than this outside the ephemeral range: choose from all of them instead.
MIN_CHOICE = 1000


def ephemeral_ports(text: str | None) -> range:
    """The kernel's ephemeral range from ``ip_local_port_range``'s text ("low high"); Linux's default if unreadable."""
    try:
        low, high = (int(field) for field in (text or "").split())
    except ValueError:
        return DEFAULT_EPHEMERAL_PORTS
    return range(low, high + 1) if 0 < low <= high < 65536 else DEFAULT_EPHEMERAL_PORTS


def rendezvous_ports(ephemeral: range) -> range:
    """Ports to choose a rendezvous from: below the ephemeral range, else above it, else any unprivileged one."""
    if ephemeral.start - LOWEST_CHOSEN_PORT >= MIN_CHOICE:
        return range(LOWEST_CHOSEN_PORT, ephemeral.start)
    if 65536 - ephemeral.stop >= MIN_CHOICE:
        return range(ephemeral.stop, 65536)
    return range(1024, 65536)


def free_port(addrs: Iterable[str] = ("127.0.0.1",), candidates: range | None = None) -> int:
    """A TCP port free on every one of ``addrs`` now, chosen outside the kernel's ephemeral range.

    Why outside: a port from ``bind(0)`` is an ephemeral one, which any outgoing connection (ssh, orted, a
    client of another run) can be given between this choice and rank 0's bind of it (EADDRINUSE, seen once in
    CI). The kernel never hands out a port outside its range by itself; a program binding the same port on
    purpose still can, which is rare.
    """
    if candidates is None:
        try:
            text: str | None = EPHEMERAL_PORTS_FILE.read_text()
        except OSError:  # not Linux
            text = None
        candidates = rendezvous_ports(ephemeral_ports(text))
    addrs = list(addrs)
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(candidates)
        try:
            for addr in addrs:
                with socket.socket() as s:
                    s.bind((addr, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port on {', '.join(addrs)} among {candidates.start}-{candidates.stop - 1}")


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


def node_name(env: Mapping[str, str] | None = None) -> str:
    """The machine this rank runs on: its pod's Kubernetes node (set by the operator), else the host's name."""
    env = os.environ if env is None else env
    return env.get(ENV_NODE_NAME) or socket.gethostname()


def detect_world(env: Mapping[str, str] | None = None) -> World:
    """Read the launcher's environment (see the module docstring)."""
    env = os.environ if env is None else env
    port = _int(env, "MASTER_PORT", DEFAULT_PORT)
    if "OMPI_COMM_WORLD_RANK" in env:
        addr = env.get("MASTER_ADDR")
        if not addr:
            hostfile = env.get(ENV_HOSTFILE, HOSTFILE_PATH)
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
