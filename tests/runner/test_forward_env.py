"""The run's own variables (``spec.pod.env``) reach every rank: the operator names them in MLBENCH_FORWARD_ENV and
the launcher gives each to mpirun as ``-x NAME`` (the ranks start under sshd, whose sessions do not inherit the
container's environment)."""

from __future__ import annotations

from mlbench_api.contract import ENV_CONFIG, ENV_FORWARD_ENV
from mlbench_runner.pod.launch import FORWARD_ENV, forwarded_env, mpirun_command


def forwarded(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-x"]


def test_the_runs_variables_are_forwarded_with_x() -> None:
    env = {
        ENV_CONFIG: "/c",
        "NCCL_IB_HCA": "mlx5",
        "UCX_TLS": "rc",
        "NOT_NAMED": "1",
        ENV_FORWARD_ENV: "NCCL_IB_HCA,UCX_TLS",
    }
    cmd = mpirun_command(world_size=2, hostfile="/h", config_path="/c", env=env)
    assert forwarded(cmd) == [ENV_CONFIG, "NCCL_IB_HCA", "UCX_TLS"]  # NOT_NAMED: not the run's, not the runner's
    assert "NOT_NAMED" not in cmd


def test_without_the_list_only_the_runners_own_are_forwarded() -> None:
    cmd = mpirun_command(world_size=2, hostfile="/h", config_path="/c", env={ENV_CONFIG: "/c", "NCCL_IB_HCA": "x"})
    assert forwarded(cmd) == [ENV_CONFIG]


def test_each_name_once_and_only_identifiers() -> None:
    env = {"NCCL_DEBUG": "INFO", "A": "1", ENV_FORWARD_ENV: " NCCL_DEBUG, A=B ,A,, UNSET"}
    assert "NCCL_DEBUG" in FORWARD_ENV  # already the runner's: not twice
    assert forwarded_env(env) == ["NCCL_DEBUG", "A"]
