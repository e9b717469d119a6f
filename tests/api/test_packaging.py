"""The distribution a cluster user installs: its name (not PyPI's unrelated ``mlbench``), the ``cli`` extra without
torch, and the ``mlbench`` console script, read from a wheel built from this checkout (offline, no dependencies)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from mlbench_api.cli import DISTRIBUTION

pytestmark = pytest.mark.multiproc


ROOT = Path(__file__).resolve().parents[2]
#: The runner's heavy packages: a user who only submits, watches and reads results must not need them.
HEAVY = ("torch", "mpi4py", "numpy", "sacrebleu", "pillow")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(out),
        str(ROOT),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    (path,) = out.glob("*.whl")
    return zipfile.ZipFile(path)


def _read(wheel: zipfile.ZipFile, suffix: str) -> str:
    (name,) = [n for n in wheel.namelist() if n.endswith(suffix) and ".dist-info/" in n]
    return wheel.read(name).decode()


def test_the_distribution_is_named_mlbench_k8s(wheel: zipfile.ZipFile) -> None:
    metadata = Parser().parsestr(_read(wheel, "METADATA"))
    assert metadata["Name"] == DISTRIBUTION == "mlbench-k8s"


def test_the_cli_extra_brings_kubernetes_and_no_torch(wheel: zipfile.ZipFile) -> None:
    metadata = Parser().parsestr(_read(wheel, "METADATA"))
    assert "cli" in (metadata.get_all("Provides-Extra") or [])
    requires = metadata.get_all("Requires-Dist") or []
    cli = [r.split(";")[0].strip() for r in requires if 'extra == "cli"' in r]
    base = [r.split(";")[0].strip() for r in requires if "extra ==" not in r]
    assert any(r.startswith("kubernetes") for r in cli), cli
    assert not [r for r in cli + base if r.lower().startswith(HEAVY)], cli + base


def test_the_console_script_is_mlbench(wheel: zipfile.ZipFile) -> None:
    assert "mlbench = mlbench_api.cli:main" in _read(wheel, "entry_points.txt")
