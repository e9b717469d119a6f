"""The CLI a cluster user installs: every command without torch, and bad input reported one way by all of them
(``file:line:col: field: message``, exit :data:`EXIT_BAD_INPUT`, never a traceback)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlbench_api.badinput import EXIT_BAD_INPUT
from tests.factories import summary

pytestmark = pytest.mark.multiproc


ROOT = Path(__file__).resolve().parents[2]

#: What ``pip install '.[cli]'`` does not install (the runner's and the operator's extras, and the plots extra).
NOT_IN_CLI = ("torch", "numpy", "mpi4py", "PIL", "sacrebleu", "prometheus_client", "structlog", "kopf", "matplotlib")
#: Run ``mlbench_api.cli.main(argv)`` with those packages impossible to import, as in a venv that installed only
#: the ``cli`` extra.
NO_TORCH = f"""
import importlib.abc, sys
BLOCKED = {NOT_IN_CLI!r}
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, Blocked())
from mlbench_api.cli import main
code = main(sys.argv[1:])
assert not set(BLOCKED) & set(sys.modules)
sys.exit(code)
"""

RUN = """apiVersion: mlbench.io/v1alpha1
kind: BenchmarkRun
metadata: {name: smoke}
spec:
  taskRef: {name: cifar10-resnet20-smoke}
  workers: 1
"""
SWEEP = """apiVersion: mlbench.io/v1alpha1
kind: BenchmarkSweep
metadata: {name: sw}
spec:
  template:
    taskRef: {name: cifar10-resnet20-smoke}
    workers: 1
  matrix: {workers: [1, 2]}
"""


def mlbench(*args: str, torch: bool = True, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mlbench_api.cli"] if torch else [sys.executable, "-c", NO_TORCH]
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd, check=False, timeout=120)


#: (what is wrong, run file, sweep file, the line:col and message every command must say)
BAD = [
    (
        "malformed YAML",
        RUN.replace("{name: smoke}", "{name: smoke"),
        SWEEP.replace("{name: sw}", "{name: sw"),
        ":4:5: invalid YAML",
    ),
    ("unknown field", RUN + "  workerz: 2\n", SWEEP + "  workerz: 2\n", "spec.workerz: Extra inputs are not permitted"),
    (
        "wrong type",
        RUN.replace("workers: 1", "workers: many"),
        SWEEP.replace("    workers: 1", "    workers: many"),
        "workers: Input should be a valid integer",
    ),
    (
        "invalid override",
        RUN + "  overrides: {maxEpochs: 2}\n",
        SWEEP.replace("    workers: 1", "    workers: 1\n    overrides: {maxEpochs: 2}"),
        "overrides: the overridden task is invalid: training.learningRate.milestones: must be less than maxEpochs",
    ),
]
#: Each command that reads a run or a sweep file, and which of the two.
COMMANDS = [
    (["validate"], "run"),
    (["config"], "run"),
    (["run", "--local", "--output-dir", "OUT"], "run"),
    (["validate"], "sweep"),
    (["sweep"], "sweep"),
    (["sweep", "--local", "--output-dir", "OUT"], "sweep"),
]


#: Every command with every kind of bad input, but an invalid override for ``mlbench sweep`` (printing a sweep's runs
#: admits none of them: the operator does; validate and --local do).
CASES = [
    pytest.param(command, reads, bad, id=f"{bad[0]}-{' '.join(command)}-{reads}")
    for bad in BAD
    for command, reads in COMMANDS
    if not (bad[0] == "invalid override" and command == ["sweep"])
]


@pytest.mark.parametrize(("command", "reads", "bad"), CASES)
def test_every_command_reports_bad_input_as_validate_does(
    tmp_path: Path, command: list[str], reads: str, bad: tuple[str, str, str, str]
) -> None:
    _what, run_text, sweep_text, said = bad
    path = tmp_path / f"{reads}.yaml"
    path.write_text(run_text if reads == "run" else sweep_text)
    argv = [str(tmp_path / "out") if arg == "OUT" else arg for arg in command]
    out = mlbench(*argv, str(path))
    assert out.returncode == EXIT_BAD_INPUT, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    first = out.stderr.splitlines()[0]
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: ", first), first  # file:line:col
    assert said in first, first
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("summary.json"))


@pytest.mark.parametrize(
    ("argv", "field"),
    [(["watch", "not-a-ref"], "run"), (["fetch", "not-a-ref"], "run"), (["catalog", "no-such-task"], "name")],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_bad_arguments_are_bad_input_too(argv: list[str], field: str) -> None:
    out = mlbench(*argv)
    assert out.returncode == EXIT_BAD_INPUT, out.stderr
    assert out.stderr.startswith(f"error: {field}: "), out.stderr  # the argument's own name, not a run's field
    assert "Traceback" not in out.stderr, out.stderr


def test_the_user_commands_run_without_torch(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(RUN)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP)
    done = tmp_path / "results" / "r1"
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps(summary().model_dump(mode="json", by_alias=True, exclude_none=True)))
    for argv in (
        ["validate", str(run), str(sweep)],
        ["config", str(run)],
        ["catalog"],
        ["sweep", str(sweep)],
        ["results", str(done), "-o", "json", "--no-plots"],
        ["--version"],
    ):
        out = mlbench(*argv, torch=False, cwd=tmp_path)
        assert out.returncode == 0, (argv, out.stderr)
    results = json.loads(mlbench("results", str(done), "-o", "json", "--no-plots", torch=False).stdout)
    assert results["runs"][0]["run"] == "r1"
    bad = mlbench("watch", "nope", torch=False)
    assert bad.returncode == EXIT_BAD_INPUT, bad.stderr
