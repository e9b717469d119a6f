"""The house's rules, read from the code (docs/architecture.md): each check is a pure function of the sources,
and each is shown to fail on a small made-up house before it is held against the real one.

* The operator has no import circle, and imports nothing inside a function (an import there hid the circles
  of ``settings.py`` once; ruff's PLC0415 says the same for operator/).
* The floor of the operator (the modules directly in ``mlbench_operator``, but the two that assemble it:
  ``handlers.py`` and ``main.py``) imports no wing (``mlbench_operator.run``, ``mlbench_operator.sweep``).
* The runner has no import circle, and its rooms import only downwards: the floor (the modules directly in
  ``mlbench_runner`` but ``cli``, which assembles the programs) and the task packages (``algorithms``, ``data``,
  ``language``, ``translation``) import no program; the programs (``rank``, ``pod``, ``tools``) import each
  other only where :data:`PROGRAM_ARROWS` says (``tools`` runs a local run through the launcher's code).
* The pod contract (``mlbench_api.contract``: environment names, paths, ports, condition types and reasons)
  is stated once: no other module of the API, the operator or the runner holds one of its values as a string
  literal of its own (``"MLBENCH_SSH_PORT"``, ``"/etc/mlbench/hostfile"``, ``"InvalidTask"``...).
* docs/architecture.md draws the rooms as they are: every module its trees of the operator and the runner name
  exists, and every module of a folder the tree lists modules of is named (a new module must be drawn); and the
  trip of one parameter names modules that exist and definitions that are in them (a renamed one must be redrawn).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from mlbench_api import contract
from mlbench_api.datasets import FetchReason

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = ROOT / "operator"
#: Where the contract's users live (each a folder of packages), and the contract's own file.
CONTRACT_USERS = (ROOT / "crds", ROOT / "operator", ROOT / "runners")
CONTRACT_FILE = ROOT / "crds" / "mlbench_api" / "contract.py"
PACKAGE = "mlbench_operator"
#: The modules that assemble the operator from its floor and its wings.
ASSEMBLY = {f"{PACKAGE}.handlers", f"{PACKAGE}.main"}
WINGS = (f"{PACKAGE}.run", f"{PACKAGE}.sweep")
RUNNERS = ROOT / "runners"
RUNNER = "mlbench_runner"
#: The runner's programs, each a package: one rank, the other pods' entry points, the user's tools.
PROGRAMS = ("rank", "pod", "tools")
#: The only arrows between two programs: a local run goes through the launcher's own code path.
PROGRAM_ARROWS = {("tools", "pod")}
#: The runner's module that assembles the programs (``mlbench-runner``'s subcommands).
RUNNER_ASSEMBLY = {f"{RUNNER}.cli", f"{RUNNER}.__main__"}
DOC = ROOT / "docs" / "architecture.md"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(root: Path, package: str = PACKAGE) -> dict[str, str]:
    """Module name -> source, for every module of ``package`` under ``root``."""
    return {module_name(p, root): p.read_text() for p in sorted((root / package).rglob("*.py"))}


def _package_of(module: str, modules: Mapping[str, str]) -> str:
    return module if f"{module}.__init__" in modules or any(m.startswith(f"{module}.") for m in modules) else ""


def imports(module: str, source: str, modules: Mapping[str, str]) -> set[str]:
    """The modules of ``modules`` that ``module`` imports (``from pkg import mod`` names the module ``pkg.mod``;
    a package's ``__init__`` only hands names on and is not counted)."""
    found: set[str] = set()
    package = module if _package_of(module, modules) else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found |= {f"{base}.{a.name}" for a in node.names} | {base}
    return {m for m in found if m in modules and m != module and not _package_of(m, modules)}


def graph(modules: Mapping[str, str]) -> dict[str, set[str]]:
    return {m: imports(m, src, modules) for m, src in modules.items()}


def circles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def late_imports(source: str) -> list[int]:
    """Lines of imports that are not at a module's top level (inside a function, a class, or an ``if``,
    ``TYPE_CHECKING`` too: each hides an arrow from whoever reads the top of the file)."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)}
    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in top)


def floor_to_wing(edges: Mapping[str, Iterable[str]]) -> list[tuple[str, str]]:
    """Arrows from the floor (a module directly in the package, not an assembling one) to a wing."""
    return sorted(
        (a, b)
        for a, targets in edges.items()
        for b in targets
        if a.count(".") == 1 and a not in ASSEMBLY and b.startswith(tuple(f"{w}." for w in WINGS))
    )


def program_of(module: str) -> str | None:
    """The runner program (``rank``, ``pod``, ``tools``) a module belongs to; None for the floor and the task
    packages."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in PROGRAMS else None


def runner_arrows_up(edges: Mapping[str, Iterable[str]]) -> list[tuple[str, str]]:
    """Arrows that go against the runner's rooms: from the floor or a task package to a program, or between two
    programs that :data:`PROGRAM_ARROWS` does not allow (the assembling ``cli`` may import any)."""
    return sorted(
        (a, b)
        for a, targets in edges.items()
        if a not in RUNNER_ASSEMBLY
        for b in targets
        if (target := program_of(b)) is not None
        and (source := program_of(a)) != target
        and (source is None or (source, target) not in PROGRAM_ARROWS)
    )


def contract_strings() -> set[str]:
    """The contract's environment names and paths: strings that say something only the contract should."""
    values = {v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str)}
    return {v for v in values if v.startswith(("MLBENCH_", "/"))}


#: Words that are Kubernetes' (a pod's phase, the kubelet's and the scheduler's reasons) or a run's phase as
#: well as one of our reasons: code that reads them from a pod, or writes a phase, names them on its own.
NOT_OURS = {"Running", "Succeeded", "Failed", "Ready", "Completed", "Unschedulable", "Evicted", "OOMKilled"}
NOT_OURS |= {"DeadlineExceeded"}


def reason_strings() -> set[str]:
    """The operator's condition types and reasons, which the API and the runner only ever import."""
    values = {str(r) for r in (*contract.Reason, *contract.DatasetReason)} | set(contract.TYPES)
    return values - NOT_OURS - {str(r) for r in FetchReason}


def restated(source: str, values: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of each string constant of ``source`` that is one of ``values`` (a docstring, or text
    that only mentions a value, is a longer string and does not count)."""
    return sorted(
        (n.lineno, n.value)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in values
    )


def drawn(doc: str, top: str) -> set[str]:
    """The modules (paths relative to the package, ``run/status.py``) that the doc's tree of ``top`` (its first
    line, e.g. ``operator/mlbench_operator/``) names. An entry at two spaces is the package's own (a folder there,
    ``run/``, holds the deeper entries after it); a module named further right belongs where the last entry did."""
    block = doc.split(f"```\n{top}\n", 1)[1].split("```", 1)[0]
    named: set[str] = set()
    folder = where = ""
    for line in block.splitlines():
        text = line.strip()
        indent = len(line) - len(line.lstrip())
        if indent == 2 and not text.startswith("--"):
            first = text.split()[0].rstrip(",")
            folder = first if first.endswith("/") and first.count("/") == 1 and "  " in text else ""
            where = ""
        elif indent == 4:  # the tree's second level
            where = folder
        named |= {f"{where}{name}" for name in re.findall(r"\b(\w+\.py)\b", text)}
    return named


def undrawn(package: Path, named: set[str]) -> tuple[list[str], list[str]]:
    """(named modules that do not exist, modules of a folder with named modules that are not named)."""
    missing = sorted(name for name in named if not (package / name).is_file())
    folders = {str(Path(name).parent) for name in named}
    modules = {
        str(path.relative_to(package)).removeprefix("./")
        for folder in folders
        for path in (package / folder).glob("*.py")
        if not path.name.startswith("__")
    }
    return missing, sorted(modules - named)


#: The heading of the doc's section that follows one parameter, and the first cell of its table's rows.
TRIP = "## The trip of one parameter"


def trip_rows(doc: str) -> list[tuple[str, list[str]]]:
    """(module path from the checkout's root, the definitions named with it) of each row of the doc's trip table:
    the rows whose second cell is one ```path.py``` (the third holds the definitions, each in backticks)."""
    section = doc.split(TRIP, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) > 2 and re.fullmatch(r"`[\w/]+\.py`", cells[1]):
            rows.append((cells[1].strip("`"), re.findall(r"`([\w.]+)`", cells[2])))
    return rows


def _defines(node: ast.stmt) -> set[str]:
    """The names a statement of a module's or a class's body defines."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def defined(source: str, dotted: str) -> bool:
    """Whether ``dotted`` (``function``, ``CONSTANT``, ``Class.method``, ``Class.field``) is defined in ``source``."""
    body: list[ast.stmt] = ast.parse(source).body
    for name in dotted.split("."):
        found = next((node for node in body if name in _defines(node)), None)
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def untraveled(root: Path, rows: Iterable[tuple[str, list[str]]]) -> list[str]:
    """The rows' modules that do not exist, and their definitions that the module does not define."""
    wrong = []
    for path, names in rows:
        if not (root / path).is_file():
            wrong.append(path)
            continue
        source = (root / path).read_text()
        wrong += [f"{path}: {name}" for name in names if not defined(source, name)]
    return wrong


# -- each check fails where it should ------------------------------------------------------------------
def _house(tmp_path: Path, files: Mapping[str, str]) -> dict[str, str]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return sources(tmp_path, "pkg")


def test_a_circle_is_found(tmp_path: Path) -> None:
    house = _house(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "from pkg.c import X\n",
            "pkg/c.py": "from pkg import a\nX = 1\n",
            "pkg/w/__init__.py": "",
            "pkg/w/d.py": "from .. import a\nfrom . import e\n",
            "pkg/w/e.py": "from pkg.w import d\n",
        },
    )
    assert circles(graph(house)) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.w.d", "pkg.w.e"]]


def test_no_circle_is_found_where_there_is_none(tmp_path: Path) -> None:
    house = _house(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import os\n"})
    assert circles(graph(house)) == []


def test_an_import_inside_a_function_or_an_if_is_found() -> None:
    source = "import os\n\nif True:\n    import sys\n\n\ndef f():\n    from pkg import a\n    return a\n"
    assert late_imports(source) == [4, 8]
    assert late_imports("import os\nfrom pkg import a\n") == []


def test_an_arrow_from_the_floor_to_a_wing_is_found() -> None:
    edges = {
        f"{PACKAGE}.settings": {f"{PACKAGE}.run.results"},
        f"{PACKAGE}.handlers": {f"{PACKAGE}.run.handlers"},
        f"{PACKAGE}.run.executor": {f"{PACKAGE}.kube"},
    }
    assert floor_to_wing(edges) == [(f"{PACKAGE}.settings", f"{PACKAGE}.run.results")]


def test_an_arrow_against_the_runners_rooms_is_found() -> None:
    edges = {
        f"{RUNNER}.comm": {f"{RUNNER}.rank.train"},  # the floor up to a program
        f"{RUNNER}.translation.task": {f"{RUNNER}.rank.summary", f"{RUNNER}.comm"},  # a task package up
        f"{RUNNER}.pod.launch": {f"{RUNNER}.tools.running", f"{RUNNER}.pod.collect"},  # pod to tools
        f"{RUNNER}.tools.local": {f"{RUNNER}.pod.launch", f"{RUNNER}.rank.train"},  # allowed, and not
        f"{RUNNER}.cli": {f"{RUNNER}.rank.train", f"{RUNNER}.pod.launch"},  # the assembly
    }
    assert runner_arrows_up(edges) == [
        (f"{RUNNER}.comm", f"{RUNNER}.rank.train"),
        (f"{RUNNER}.pod.launch", f"{RUNNER}.tools.running"),
        (f"{RUNNER}.tools.local", f"{RUNNER}.rank.train"),
        (f"{RUNNER}.translation.task", f"{RUNNER}.rank.summary"),
    ]


def test_a_restated_contract_value_is_found() -> None:
    values = contract_strings() | reason_strings()
    assert {"MLBENCH_SSH_PORT", "/etc/mlbench/hostfile", "MLBENCH_RUN_CONFIG", "InvalidTask"} <= values
    source = 'PORT = os.environ.get("MLBENCH_SSH_PORT", "2222")\nWHY = "set MLBENCH_SSH_PORT"\nR = "InvalidTask"\n'
    assert restated(source, values) == [(1, "MLBENCH_SSH_PORT"), (3, "InvalidTask")]


# -- the operator as it is -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def operator() -> dict[str, str]:
    return sources(OPERATOR)


def test_the_operator_is_read(operator: dict[str, str]) -> None:
    """The checks below see the whole operator (a wrong path would make them pass on nothing)."""
    assert {f"{PACKAGE}.run.executor", f"{PACKAGE}.sweep.plan", f"{PACKAGE}.runtime"} <= set(operator)
    assert f"{PACKAGE}.run.status" in graph(operator)[f"{PACKAGE}.run.executor"]


def test_the_operator_has_no_import_circle(operator: dict[str, str]) -> None:
    assert circles(graph(operator)) == []


def test_the_operator_imports_nothing_inside_a_function(operator: dict[str, str]) -> None:
    late = {m: lines for m, src in operator.items() if (lines := late_imports(src))}
    assert late == {}


def test_the_operators_floor_imports_no_wing(operator: dict[str, str]) -> None:
    assert floor_to_wing(graph(operator)) == []


def test_the_contract_is_stated_once() -> None:
    """The runner, the operator and the CLI import the contract's environment names and paths, the API and
    the runner its reasons (the operator's own code names its reasons through them too); none restates one."""
    paths = contract_strings()
    reasons = reason_strings()
    found = {
        str(path.relative_to(ROOT)): hits
        for root in CONTRACT_USERS
        for path in sorted(root.rglob("*.py"))
        if path != CONTRACT_FILE
        and (hits := restated(path.read_text(), paths | (reasons if root != OPERATOR else set())))
    }
    assert found == {}


# -- the runner as it is -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runner() -> dict[str, str]:
    return sources(RUNNERS, RUNNER)


def test_the_runner_is_read(runner: dict[str, str]) -> None:
    """Every program is seen (a wrong path would make the checks below pass on nothing)."""
    assert {f"{RUNNER}.rank.train", f"{RUNNER}.pod.launch", f"{RUNNER}.tools.report", f"{RUNNER}.comm"} <= set(runner)
    assert f"{RUNNER}.pod.launch" in graph(runner)[f"{RUNNER}.tools.processes"]


def test_the_runner_has_no_import_circle(runner: dict[str, str]) -> None:
    assert circles(graph(runner)) == []


def test_the_runners_rooms_import_only_downwards(runner: dict[str, str]) -> None:
    assert runner_arrows_up(graph(runner)) == []


# -- the doc as it is ----------------------------------------------------------------------------------------
MADE_UP_DOC = """
```
pkg/
  a.py             the first; its description names c.py (still pkg's own)
  -- a section --
  w/               a folder
    x.py, y.py
                   a description's line, z.py named too
  b.py
```
"""


def test_a_module_the_doc_does_not_draw_is_found(tmp_path: Path) -> None:
    assert drawn(MADE_UP_DOC, "pkg/") == {"a.py", "c.py", "w/x.py", "w/y.py", "w/z.py", "b.py"}
    for name in ("a.py", "b.py", "c.py", "d.py", "w/x.py", "w/y.py", "w/z.py", "w/new.py", "w/__init__.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "c.py").unlink()
    assert undrawn(tmp_path, drawn(MADE_UP_DOC, "pkg/")) == (["c.py"], ["d.py", "w/new.py"])


MADE_UP_TRIP = f"""
{TRIP}: x

| # | module | definitions | named | what happens |
|---|---|---|---|---|
| 1 | `pkg/a.py` | `run`, `Spec.workers`, `LIMIT` | `workers` | read |
| 2 | `pkg/a.py` | `Spec.gone`, `missing`, `Spec.run.inner` | `n` | renamed since |
| 3 | `pkg/b.py` | `anything` | `n` | moved since |
| 4 | words | `not/a/row.py` | | |

## The next section
| 5 | `pkg/later.py` | `x` | | |
"""


def test_a_trip_through_a_module_or_a_definition_that_is_not_there_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        "LIMIT = 3\n\ndef run() -> None:\n    missing = 1\n\nclass Spec:\n    workers: int = 1\n"
        "    def run(self) -> None:\n        inner = 2\n"
    )
    rows = trip_rows(MADE_UP_TRIP)
    assert [path for path, _ in rows] == ["pkg/a.py", "pkg/a.py", "pkg/b.py"]
    assert untraveled(tmp_path, rows) == [
        "pkg/a.py: Spec.gone",
        "pkg/a.py: missing",  # a function's local is no definition
        "pkg/a.py: Spec.run.inner",
        "pkg/b.py",
    ]


def test_the_trip_of_one_parameter_names_what_there_is() -> None:
    rows = trip_rows(DOC.read_text())
    assert len(rows) >= 10  # the table was read
    assert {path.split("/")[0] for path, _ in rows} == {"crds", "operator", "runners"}
    assert untraveled(ROOT, rows) == []


@pytest.mark.parametrize(
    ("top", "package"),
    [("operator/mlbench_operator/", OPERATOR / PACKAGE), ("runners/mlbench_runner/", RUNNERS / RUNNER)],
)
def test_the_doc_draws_every_module(top: str, package: Path) -> None:
    named = drawn(DOC.read_text(), top)
    assert len(named) > 20  # the tree was read
    assert undrawn(package, named) == ([], [])
