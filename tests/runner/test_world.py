"""Rank and rendezvous detection from OpenMPI, torch-style and empty environments."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from mlbench_runner import world as world_module
from mlbench_runner.world import detect_world, ephemeral_ports, free_port, parse_hostfile, rendezvous_ports


def test_openmpi_env_uses_hostfile_first_host(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# comment\nrun-worker-0.run slots=2\nrun-worker-1.run slots=2\n")
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MLBENCH_HOSTFILE": str(hostfile),
    }
    w = detect_world(env)
    assert (w.rank, w.size, w.local_rank, w.local_size) == (3, 4, 1, 2)
    assert w.master_addr == "run-worker-0.run"
    assert w.master_port == 29500
    assert w.launcher == "mpirun"
    assert detect_world({**env, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "1234"}).master_addr == "10.0.0.5"


def test_torch_style_and_single() -> None:
    w = detect_world({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "5"})
    assert (w.rank, w.size, w.master_addr, w.master_port, w.launcher) == (1, 2, "h", 5, "env")
    single = detect_world({})
    assert (single.rank, single.size, single.launcher) == (0, 1, "single")


def test_bad_values_name_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        detect_world({"RANK": "0", "WORLD_SIZE": "two"})
    bad = tmp_path / "hostfile"
    bad.write_text("host slots=x\n")
    with pytest.raises(ValueError, match="slots"):
        parse_hostfile(bad)
    assert parse_hostfile(_write(tmp_path / "h2", "a slots=2\nb\n")) == [("a", 2), ("b", 1)]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32768\t60999\n", range(32768, 61000)),
        ("10000 20000", range(10000, 20001)),
        (None, range(32768, 61000)),  # not Linux: Linux's default
        ("", range(32768, 61000)),
        ("32768", range(32768, 61000)),
        ("high low", range(32768, 61000)),
        ("40000 30000", range(32768, 61000)),
    ],
)
def test_the_kernel_s_ephemeral_range(text: str | None, expected: range) -> None:
    assert ephemeral_ports(text) == expected


@pytest.mark.parametrize(
    ("ephemeral", "expected"),
    [
        (range(32768, 61000), range(20000, 32768)),  # Linux's default: below it
        (range(1024, 50000), range(50000, 65536)),  # starts low: above it
        (range(15000, 65000), range(1024, 65536)),  # no room either side: any unprivileged port
    ],
)
def test_rendezvous_ports_avoid_the_ephemeral_range(ephemeral: range, expected: range) -> None:
    assert rendezvous_ports(ephemeral) == expected


#: Below Linux's default ephemeral range (32768-60999), from 20000: where a rendezvous port is chosen.
BELOW_EPHEMERAL = range(20000, 32768)


def test_a_free_port_is_outside_the_ephemeral_range_and_free(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """bind(0) hands out an ephemeral port, which an outgoing connection can take before rank 0 binds it."""
    ports_file = tmp_path / "ip_local_port_range"
    ports_file.write_text("32768\t60999\n")
    monkeypatch.setattr(world_module, "EPHEMERAL_PORTS_FILE", ports_file)
    ports = {free_port() for _ in range(20)}
    assert ports <= set(BELOW_EPHEMERAL), ports
    assert len(ports) > 1, "chosen at random, so two runs starting together rarely meet"
    busy = free_port()  # two ports below the ephemeral range, where nothing else takes one by itself
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", busy))
        taken.listen()
        neighbour = next((port for port in (busy + 1, busy - 1) if port in BELOW_EPHEMERAL and _bindable(port)), None)
        if neighbour is None:
            pytest.skip(f"both neighbours of port {busy} are in use")
        candidates = range(min(busy, neighbour), max(busy, neighbour) + 1)
        assert {free_port(candidates=candidates) for _ in range(10)} == {neighbour}


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_node_name_is_the_pod_s_node_else_the_host_s() -> None:
    assert world_module.node_name({"MLBENCH_NODE_NAME": "mlbench-node-1"}) == "mlbench-node-1"
    assert world_module.node_name({}) == socket.gethostname()
    assert world_module.node_name({"MLBENCH_NODE_NAME": ""}) == socket.gethostname()
