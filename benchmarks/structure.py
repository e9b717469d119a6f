"""The code's structure in figures (issue 31's before and after), as JSON on stdout:

    .venv/bin/python benchmarks/structure.py [--root CHECKOUT] > benchmarks/results/<date>-structure-<when>.json

Over the shipped packages (``crds/mlbench_api``, ``operator/mlbench_operator``, ``runners/mlbench_runner``) of the
checkout at ``--root`` (default: this one, so an older commit is measured by the same code through a
``git worktree``): the largest module (lines of the file), the largest function (lines from its ``def`` to its
last line, decorators not counted; a method and a nested function count on their own, and within their parent),
the import circles among the three packages' modules (strongly connected groups of more than one module, as
``tests/test_architecture.py`` finds them, with the same import graph: a package's ``__init__`` is no node) and
the modules over :data:`LIMIT` lines.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for sub in ("crds", "runners", "."):
    if str(REPO / sub) not in sys.path:
        sys.path.insert(0, str(REPO / sub))

from tests.test_architecture import circles, graph, sources  # noqa: E402

#: (folder, package) of each shipped package, relative to a checkout.
PACKAGES = (("crds", "mlbench_api"), ("operator", "mlbench_operator"), ("runners", "mlbench_runner"))
#: Modules above this many lines are counted (issue 31: "modules under about 600 lines").
LIMIT = 600


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function and method in ``tree``, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            yield name, (node.end_lineno or node.lineno) - node.lineno + 1
            yield from functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def files(root: Path) -> dict[str, str]:
    """Path relative to ``root`` -> source, for every module of the shipped packages."""
    return {
        str(path.relative_to(root)): path.read_text()
        for folder, package in PACKAGES
        for path in sorted((root / folder / package).rglob("*.py"))
    }


def measure(root: Path) -> dict[str, Any]:
    """The figures of the checkout at ``root`` (see the module's docstring)."""
    texts = files(root)
    lines = {path: len(text.splitlines()) for path, text in texts.items()}
    funcs = [(path, name, n) for path, text in texts.items() for name, n in functions(ast.parse(text))]
    modules: dict[str, str] = {}
    for folder, package in PACKAGES:
        modules |= sources(root / folder, package)
    found = circles(graph(modules))
    biggest = max(lines.items(), key=lambda item: (item[1], item[0]))
    longest = max(funcs, key=lambda f: (f[2], f[0], f[1]), default=None)
    over = sorted(((p, n) for p, n in lines.items() if n > LIMIT), key=lambda item: -item[1])
    return {
        "modules": len(lines),
        "lines": sum(lines.values()),
        "largest_module": {"path": biggest[0], "lines": biggest[1]},
        "largest_function": None if longest is None else dict(zip(("path", "name", "lines"), longest, strict=True)),
        "import_cycles": len(found),
        "cycles": found,
        "modules_over_limit": len(over),
        "limit": LIMIT,
        "over_limit": [{"path": p, "lines": n} for p, n in over],
    }


def commit(root: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout to measure (default: this one)")
    root = parser.parse_args(argv).root.resolve()
    print(json.dumps({"commit": commit(root), **measure(root)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
