"""The data package has no import cycle: ``base`` imports none of its siblings, and every module imports alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import env

DATA = Path(__file__).resolve().parents[2] / "runners" / "mlbench_runner" / "data"
PACKAGE = "mlbench_runner.data"


def modules() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.py") if p.stem != "__init__")


def imported(path: Path) -> set[str]:
    """The absolute module names a file imports (anywhere in it, lazy imports included); a relative
    import is resolved against the data package."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = PACKAGE if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names.add(module)
            names |= {f"{module}.{alias.name}" for alias in node.names}  # `from pkg import sibling`
    return names


def test_the_package_holds_the_expected_modules() -> None:
    assert {"base", "cifar", "loader", "tabular"} <= set(modules())


def test_base_imports_no_sibling() -> None:
    siblings = {f"{PACKAGE}.{m}" for m in modules()} | {PACKAGE}
    found = imported(DATA / "base.py") & siblings
    assert not found, f"data/base.py imports {sorted(found)}: the dispatch belongs in data/loader.py"


def test_only_the_loader_imports_the_format_modules() -> None:
    formats = {f"{PACKAGE}.cifar", f"{PACKAGE}.tabular"}
    for module in modules():
        if module != "loader":
            assert not imported(DATA / f"{module}.py") & (formats - {f"{PACKAGE}.{module}"}), module


@pytest.mark.multiproc
@pytest.mark.parametrize("module", [PACKAGE, *(f"{PACKAGE}.{m}" for m in ("base", "cifar", "tabular", "loader"))])
def test_each_data_module_imports_in_a_fresh_interpreter(module: str) -> None:
    code = f"import {module}"
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_the_package_exports_the_dataset_and_the_loader() -> None:
    from mlbench_runner import data
    from mlbench_runner.data.base import TensorDataset
    from mlbench_runner.data.loader import load_dataset

    assert set(data.__all__) == {"TensorDataset", "load_dataset"}
    assert data.TensorDataset is TensorDataset
    assert data.load_dataset is load_dataset
