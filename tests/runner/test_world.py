"""Rank and rendezvous detection from OpenMPI, torch-style and empty environments."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlbench_runner.world import detect_world, parse_hostfile


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
