"""The `mlbench` API commands, run as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlbench_api.badinput import EXIT_BAD_INPUT
from tests.api.examples import EXAMPLES

pytestmark = pytest.mark.multiproc


ROOT = Path(__file__).resolve().parents[2]


def mlbench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlbench_api.cli", *args], capture_output=True, text=True, cwd=ROOT, check=False
    )


def test_catalog_lists_every_task() -> None:
    out = mlbench("catalog")
    assert out.returncode == 0, out.stderr
    assert "cifar10-resnet20 " in out.stdout
    assert "epsilon-logreg " in out.stdout
    assert "80%" in out.stdout


def test_catalog_prints_one_task_as_yaml() -> None:
    out = mlbench("catalog", "epsilon-logreg")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["spec"]["training"]["batchSizePerWorker"] == 100


def test_validate_accepts_valid_and_names_the_field_of_invalid() -> None:
    ok = mlbench("validate", str(EXAMPLES / "valid" / "run-full.yaml"))
    assert ok.returncode == 0, ok.stderr
    bad = mlbench("validate", str(EXAMPLES / "invalid" / "run-workers-too-many.yaml"))
    assert bad.returncode == EXIT_BAD_INPUT
    assert "spec.workers: Input should be less than or equal to 1024" in bad.stderr


def test_config_prints_the_effective_configuration() -> None:
    out = mlbench("config", str(EXAMPLES / "valid" / "run-mpi-cpu.yaml"))
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["worldSize"] == 16
    assert cfg["lr"]["alpha"] == 800


def test_config_with_unknown_task_names_the_field(tmp_path: Path) -> None:
    run = yaml.safe_load((EXAMPLES / "valid" / "run-minimal.yaml").read_text())
    run["spec"]["taskRef"]["name"] = "no-such-task"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    out = mlbench("config", str(path))
    assert out.returncode == EXIT_BAD_INPUT
    assert "spec.taskRef.name: no task 'no-such-task'" in out.stderr


def test_crds_check_detects_stale_files(tmp_path: Path) -> None:
    assert mlbench("crds", "--output-dir", str(tmp_path)).returncode == 0
    assert mlbench("crds", "--check", "--output-dir", str(tmp_path)).returncode == 0
    victim = next(tmp_path.glob("mlbench.io_benchmarkruns.yaml"))
    victim.write_text(victim.read_text() + "# edited by hand\n")
    out = mlbench("crds", "--check", "--output-dir", str(tmp_path))
    assert out.returncode == 1
    assert "benchmarkruns" in out.stderr


def test_catalog_and_config_of_a_collectives_task() -> None:
    listing = mlbench("catalog")
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if line.startswith("backend-collectives "))
    assert row.split()[1:4] == ["closed", "collectives", "4B..256MiB"]
    out = mlbench("config", str(EXAMPLES / "valid" / "run-collectives.yaml"))
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["worldSize"] == 4
    assert cfg["task"]["collectives"]["maxBytes"] == 256 * 1024 * 1024
    assert "goalTarget" not in cfg
    assert "lr" not in cfg


def mlbench_env(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlbench_api.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        env={**os.environ, **env},
    )


def test_a_mistyped_catalog_folder_is_an_error_not_an_empty_catalog(tmp_path: Path) -> None:
    out = mlbench_env({"MLBENCH_CATALOG": str(tmp_path / "no-such-folder")}, "catalog")
    assert out.returncode == EXIT_BAD_INPUT
    assert out.stderr == f"error: $MLBENCH_CATALOG: {tmp_path / 'no-such-folder'} is not a directory\n"


def test_crds_into_a_path_that_cannot_be_a_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    out = mlbench("crds", "--output-dir", str(tmp_path / "afile" / "crds"))
    assert out.returncode == 1
    assert out.stderr.startswith(f"error: --output-dir: cannot write the CRDs into {tmp_path / 'afile' / 'crds'}: ")
    assert "Traceback" not in out.stderr


def test_a_kubeconfig_that_is_not_yaml_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text("garbage: [")
    env = {"KUBECONFIG": str(tmp_path / "kubeconfig"), "KUBERNETES_SERVICE_HOST": ""}
    out = mlbench_env(env, "fetch", "default/some-run", "--output-dir", str(tmp_path / "out"))
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    assert "no cluster configuration (kubeconfig: " in out.stderr


def test_validate_names_a_mistyped_catalog_folder(tmp_path: Path) -> None:
    """A run whose task is in no file given: the message says the catalog variable names no folder, not that
    it should be set (it is)."""
    out = mlbench_env(
        {"MLBENCH_CATALOG": str(tmp_path / "no-such-folder")}, "validate", str(EXAMPLES / "valid" / "run-minimal.yaml")
    )
    assert out.returncode == EXIT_BAD_INPUT
    assert f"$MLBENCH_CATALOG: {tmp_path / 'no-such-folder'} is not a directory" in out.stderr + out.stdout
