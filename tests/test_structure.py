"""benchmarks/structure.py's figures, on small made-up checkouts: each figure must be able to come out wrong."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "structure.py"


def _structure() -> Any:
    spec = importlib.util.spec_from_file_location("structure", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _checkout(root: Path, files: Mapping[str, str]) -> Path:
    """The three packages, empty but for ``files`` (path relative to the checkout -> source)."""
    for folder, package in (("crds", "mlbench_api"), ("operator", "mlbench_operator"), ("runners", "mlbench_runner")):
        (root / folder / package).mkdir(parents=True)
        (root / folder / package / "__init__.py").write_text("")
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_a_circle_across_packages_is_counted_and_a_line_without_it_is_not(tmp_path: Path) -> None:
    structure = _structure()
    circle = {
        "crds/mlbench_api/a.py": "from mlbench_operator import b\n",
        "operator/mlbench_operator/b.py": "from mlbench_api.c import X\n",
        "crds/mlbench_api/c.py": "from mlbench_api import a\nX = 1\n",
        "runners/mlbench_runner/d.py": "from mlbench_api import c\n",  # into the circle, not part of it
    }
    found = structure.measure(_checkout(tmp_path / "circle", circle))
    assert found["import_cycles"] == 1
    assert found["cycles"] == [["mlbench_api.a", "mlbench_api.c", "mlbench_operator.b"]]
    line = {**circle, "crds/mlbench_api/c.py": "X = 1\n"}  # c no longer imports a
    assert structure.measure(_checkout(tmp_path / "line", line))["import_cycles"] == 0


def test_the_largest_module_and_function_and_the_modules_over_the_limit(tmp_path: Path) -> None:
    structure = _structure()
    method = "class K:\n    def long(self) -> None:\n" + "        x = 1\n" * 9 + "\n"  # 10 lines
    nested = "def outer() -> None:\n    def inner() -> None:\n        pass\n    inner()\n"  # 4 lines, inner 2
    big = "X = 0\n" * (structure.LIMIT + 1)
    files = {
        "crds/mlbench_api/m.py": method + nested,
        "runners/mlbench_runner/big.py": big,
        "operator/mlbench_operator/at_limit.py": "Y = 0\n" * structure.LIMIT,
    }
    found = structure.measure(_checkout(tmp_path, files))
    assert found["largest_module"] == {"path": "runners/mlbench_runner/big.py", "lines": structure.LIMIT + 1}
    assert found["largest_function"] == {"path": "crds/mlbench_api/m.py", "name": "K.long", "lines": 10}
    assert found["modules_over_limit"] == 1  # at the limit is not over it
    assert dict(structure.functions(structure.ast.parse(nested))) == {"outer": 4, "outer.inner": 2}
