"""The task's runner.command is what every rank runs (the open division's own trainers)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from mlbench_api import BenchmarkRun, BenchmarkTaskSpec
from mlbench_api.config import effective_config
from mlbench_api.contract import ENV_CONFIG
from mlbench_api.results import RunSummary
from mlbench_runner.pod.launch import mpirun_command, rank_command
from mlbench_runner.tools.processes import run_processes

from .helpers import logreg_task, run_doc
from .test_mpirun import launch

#: A stand-in for an open-division image's own trainer: reads the run configuration the launcher
#: exports, and reports through the result contract (rank 0 writes <outputDir>/summary.json).
CUSTOM_TRAINER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    config = json.loads(Path(os.environ["MLBENCH_RUN_CONFIG"]).read_text())
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    out = Path(config["outputDir"])
    (out / f"custom-rank-{rank}").write_text(" ".join(sys.argv[1:]))
    if rank == 0:
        summary = {
            "run": config["runName"], "task": config["taskName"], "status": "success", "goalReached": True,
            "epochs": 1.0, "steps": 7, "samples": 70, "wallClockSeconds": 1.5, "trainSeconds": 1.0,
            "computeSeconds": 0.75, "communicationSeconds": 0.25, "samplesPerSecond": 70.0, "phases": {},
            "environment": {"worldSize": config["worldSize"], "backend": config["backend"], "algorithm": "custom"},
        }
        (out / "summary.json").write_text(json.dumps(summary))
    """
)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["mlbench-runner", "train"], [sys.executable, "-m", "mlbench_runner.cli", "train", "--config", "/c.json"]),
        (
            ["mlbench-runner", "collectives", "--output-dir", "/o"],
            [sys.executable, "-m", "mlbench_runner.cli", "collectives", "--output-dir", "/o", "--config", "/c.json"],
        ),
        (["/opt/trainer/bin/train", "--fast"], ["/opt/trainer/bin/train", "--fast"]),
        (["python3", "-m", "mytrainer"], ["python3", "-m", "mytrainer"]),
    ],
)
def test_rank_command(command: list[str], expected: list[str]) -> None:
    assert rank_command(command, "/c.json") == expected


def test_empty_command_is_refused() -> None:
    with pytest.raises(ValueError, match=r"runner\.command"):
        rank_command([], "/c.json")


def test_mpirun_runs_the_tasks_command() -> None:
    cmd = mpirun_command(
        world_size=2, hostfile="/h", config_path="/etc/mlbench/config.json", env={}, command=["/opt/t", "--x"]
    )
    assert cmd[-2:] == ["/opt/t", "--x"]
    assert "mlbench_runner.cli" not in cmd


def _custom_config(tmp_path: Path, ranks: int) -> Path:
    script = tmp_path / "custom_trainer.py"
    script.write_text(CUSTOM_TRAINER)
    task = logreg_task()
    task["runner"]["command"] = [sys.executable, str(script), "--flag"]
    out = tmp_path / "out"
    out.mkdir()
    run = BenchmarkRun.model_validate(run_doc("custom", "test-task", ranks))
    config = effective_config(run, "test-task", BenchmarkTaskSpec.model_validate(task), output_dir=str(out))
    path = out / "config.json"
    path.write_text(config.dump())
    return path


@pytest.mark.multiproc
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed on this machine")
def test_launcher_runs_a_custom_command_on_every_rank(tmp_path: Path) -> None:
    path = _custom_config(tmp_path, 2)
    out = path.parent
    proc = launch(path, out, 2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        assert (out / f"custom-rank-{rank}").read_text() == "--flag"  # its own argv, no --config appended
    summary = RunSummary.from_termination_message((out / "termination-log").read_text())
    assert (summary.steps, summary.environment.algorithm) == (7, "custom")


@pytest.mark.multiproc
def test_local_processes_run_a_custom_command(tmp_path: Path) -> None:
    path = _custom_config(tmp_path, 2)
    config = json.loads(path.read_text())
    env = {**os.environ, ENV_CONFIG: str(path)}
    lines: list[str] = []
    code = run_processes(path, 2, env, lines.append, config["task"]["runner"]["command"])
    assert code == 0, lines
    assert sorted(p.name for p in path.parent.glob("custom-rank-*")) == ["custom-rank-0", "custom-rank-1"]
