"""The distribution a cluster user installs: its name (not PyPI's unrelated ``mlbench``), the ``cli`` extra without
torch, and the ``mlbench`` console script, read from a wheel built from this checkout (offline, no dependencies)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mlbench_api.cli import DISTRIBUTION
from mlbench_api.watch import EXIT_UNAVAILABLE
from tests.api.test_cli_user import RUN

pytestmark = pytest.mark.multiproc


ROOT = Path(__file__).resolve().parents[2]
#: The runner's heavy packages: a user who only submits, watches and reads results must not need them.
HEAVY = ("torch", "mpi4py", "numpy", "sacrebleu", "pillow")


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
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
    return path


@pytest.fixture(scope="module")
def wheel(wheel_path: Path) -> zipfile.ZipFile:
    return zipfile.ZipFile(wheel_path)


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


def test_the_wheel_carries_the_catalog(wheel: zipfile.ZipFile) -> None:
    """``pip install`` gives the CLI the catalog too (validate finds a run's task, catalog lists the tasks)."""
    shipped = sorted(Path(n).name for n in wheel.namelist() if ".data/data/share/mlbench-k8s/catalog/" in n)
    assert shipped == sorted(p.name for p in (ROOT / "manifests" / "catalog").glob("*.yaml"))


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions ``requirements`` need, transitively (markers evaluated here)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.distribution(req.name).requires or []:
            sub = Requirement(text)
            extras = ["", *req.extras]
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append(sub)
    return seen


def _link_only(distributions: set[str], into: Path) -> None:
    """Make ``into`` a folder of links to the installed files of ``distributions`` only (their top-level
    packages, modules and .dist-info), so a venv that reads it sees nothing else of this environment."""
    into.mkdir()
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in distributions:
            continue
        for file in dist.files or []:
            top = file.parts[0]
            source = Path(str(dist.locate_file(top)))
            if top != ".." and source.exists() and not (into / top).exists():
                (into / top).symlink_to(source)


def test_pip_install_of_the_cli_extra_works_in_a_clean_venv(wheel_path: Path, tmp_path: Path) -> None:
    """The README's ``pip install '.[cli]'``: a venv with the wheel and only what its ``cli`` extra needs (taken
    from this environment, offline); torch cannot be imported there, and validate, catalog and config work."""
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, capture_output=True, timeout=300)
    python = env / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel_path)]
    subprocess.run(pip, check=True, capture_output=True, timeout=300)
    needs = [r for r in metadata.requires(DISTRIBUTION) or [] if "extra ==" not in r or 'extra == "cli"' in r]
    deps = tmp_path / "deps"
    _link_only(_closure([r.split(";")[0] for r in needs]), deps)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "cli-deps.pth").write_text(f"{deps}\n")
    clean = {"PATH": f"{env / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}  # no PYTHONPATH, no MLBENCH_CATALOG
    torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, env=clean, check=False)
    assert "No module named 'torch'" in torch.stderr
    run = tmp_path / "run.yaml"
    run.write_text(RUN)
    for argv in (["validate", str(run)], ["catalog"], ["config", str(run)], ["--version"]):
        out = subprocess.run(
            [str(env / "bin" / "mlbench"), *argv], capture_output=True, text=True, env=clean, cwd=tmp_path, check=False
        )
        assert out.returncode == 0, (argv, out.stdout, out.stderr)
        if argv == ["validate", str(run)]:
            assert "task cifar10-resnet20-smoke from the catalog" in out.stdout, out.stdout
    # watch reaches the Kubernetes client (the extra's) and says in one line that there is no cluster to ask
    watch = subprocess.run(
        [str(env / "bin" / "mlbench"), "watch", "ns/r"], capture_output=True, text=True, env=clean, check=False
    )
    assert watch.returncode == EXIT_UNAVAILABLE, watch.stderr
    assert "no cluster configuration" in watch.stderr
    assert "Traceback" not in watch.stderr
