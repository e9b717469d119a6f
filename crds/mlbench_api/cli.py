"""``mlbench``: the user's command line.

API commands (crds, catalog, validate, config) live here and need neither torch nor a
cluster; ``run`` and ``results`` hand over to the runner package, imported lazily so the
operator image never needs torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from mlbench_api.badinput import EXIT_BAD_INPUT, BadInput, bad_input, report
from mlbench_api.catalog import (
    CATALOG_ENV,
    Document,
    catalog_dir,
    get_task,
    load_catalog,
    load_documents,
    null_fields,
    parse_run,
    parse_task,
    read_documents,
    strict_validate,
)
from mlbench_api.common import GROUP
from mlbench_api.config import AlgorithmNotAllowed, OverrideNotAllowed, RunConfig, effective_config, local_task
from mlbench_api.contract import Reason
from mlbench_api.crdgen import stale, write_all
from mlbench_api.display import score
from mlbench_api.download import ResultsUnavailable, default_dir, download, parse_ref
from mlbench_api.errors import InvalidObject, format_errors
from mlbench_api.output import JSON, TABLE, TEXT, YAML, add_output, dump
from mlbench_api.run import BenchmarkRun
from mlbench_api.runstatus import BenchmarkRunStatus
from mlbench_api.sweep import MATRIX_FIELD, BenchmarkSweep, expand
from mlbench_api.task import BenchmarkTask, BenchmarkTaskSpec
from mlbench_api.watch import EXIT_UNAVAILABLE, follow

#: The distribution ``pip install`` knows this package by (``mlbench`` on PyPI is another project).
DISTRIBUTION = "mlbench-k8s"
DEFAULT_CRD_DIR = Path(__file__).resolve().parents[1] / "bases"


def _crds(args: argparse.Namespace) -> int:
    directory = Path(args.output_dir)
    if args.check:
        outdated = stale(directory)
        if outdated:
            print("stale CRDs (run `make crds`): " + ", ".join(outdated), file=sys.stderr)
            return 1
        print(f"CRDs in {directory} are up to date")
        return 0
    try:
        written = write_all(directory)
    except OSError as exc:
        print(f"error: --output-dir: cannot write the CRDs into {directory}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


def _catalog(args: argparse.Namespace) -> int:
    tasks = load_catalog()
    if args.name and args.name not in tasks:
        raise BadInput(f"name: no task {args.name!r} in the catalog (known: {', '.join(sorted(tasks)) or 'none'})")
    tasks = {args.name: tasks[args.name]} if args.name else tasks
    fmt = args.output or (YAML if args.name else TABLE)  # one task: its YAML, as before -o
    if fmt == TABLE:
        _catalog_table(tasks)
    else:
        print(dump([task.to_api() for _, task in sorted(tasks.items())], fmt, single=bool(args.name)), end="")
    return 0


def _catalog_table(tasks: Mapping[str, BenchmarkTask]) -> None:
    print(f"{'TASK':<28} {'DIVISION':<8} {'MODEL':<24} {'DATASET':<18} {'BATCH':>5} {'EPOCHS':>6} {'TARGET':>6}")
    for name, task in sorted(tasks.items()):
        s = task.spec
        if s.collectives is not None:  # task 0a: no model, data or goal; the columns say what it times
            sweep = s.collectives
            print(
                f"{name:<28} {s.division.value:<8} {'collectives':<24} "
                f"{_bytes(sweep.min_bytes) + '..' + _bytes(sweep.max_bytes):<18} {'-':>5} {'-':>6} {'-':>6}"
            )
            continue
        model = s.model.name.value + (f"-{s.model.depth}{s.model.version}" if s.model.depth else "")
        print(
            f"{name:<28} {s.division.value:<8} {model:<24} {s.dataset.name:<18} "
            f"{s.training.batch_size_per_worker:>5} {s.training.max_epochs:>6} "
            f"{score(s.goal.metric, s.goal.target, target=True):>6}"
        )


def _bytes(n: int) -> str:
    """``4B``, ``64KiB``, ``256MiB``: a message size as the catalog listing shows it."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


_FIELD = re.compile(r"^([A-Za-z][\w./-]*): ")
#: pydantic's message for a field the model does not know (extra="forbid")
_UNKNOWN = "Extra inputs are not permitted"
#: The kinds ``mlbench validate`` checks, and how.
_PARSERS: dict[str, Callable[[dict[str, Any], str], BenchmarkRun | BenchmarkTask | BenchmarkSweep]] = {
    "BenchmarkRun": parse_run,
    "BenchmarkTask": parse_task,
    "BenchmarkSweep": lambda doc, source: strict_validate(BenchmarkSweep, doc, source),
}


@dataclass
class _Checked:
    """One non-empty document and the verdict on it."""

    doc: Document
    #: the parsed object; None when it failed, or when it is not an MLBench object (``skipped``)
    obj: BenchmarkRun | BenchmarkTask | BenchmarkSweep | None = None
    problems: list[str] = field(default_factory=list)
    #: why the document was not checked (another API group's object, e.g. a ConfigMap next to the runs)
    skipped: str = ""
    #: said after "valid" (which task a run resolved to)
    detail: str = ""
    #: ``field: message`` lines about what the API server accepts but is likely a mistake
    warnings: list[str] = field(default_factory=list)


@dataclass
class _File:
    """One file given to ``mlbench validate``: its documents and what stopped its reading."""

    name: str
    checked: list[_Checked] = field(default_factory=list)
    #: a syntax error (with everything before it still checked) or an unreadable or empty file
    error: list[str] = field(default_factory=list)
    multi: bool = False


def _not_parsed(doc: Document) -> _Checked | None:
    """The verdict on a document that is not parsed as one of ours (refused, not a mapping, without apiVersion
    or kind, another group's); None for one that is."""
    data = doc.data
    if doc.refused:
        return _Checked(doc, problems=[doc.refused])
    if not isinstance(data, dict):
        return _Checked(doc, problems=[doc.not_a_mapping()])
    api_version, kind = data.get("apiVersion"), data.get("kind")
    missing = [f"{key}: Field required" for key, value in (("apiVersion", api_version), ("kind", kind)) if not value]
    if missing:
        return _Checked(doc, problems=missing)
    if isinstance(api_version, str) and api_version.split("/")[0] != GROUP:
        return _Checked(doc, skipped=f"{api_version} {kind} is not an MLBench object: not checked")
    return None


def _check_document(doc: Document) -> _Checked:
    """What the API server says about one document."""
    verdict = _not_parsed(doc)
    if verdict is not None:
        return verdict
    data: dict[str, Any] = doc.data
    kind = data.get("kind")
    parse = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parse is None:
        return _Checked(doc, problems=[f"kind: expected {' or '.join(_PARSERS)}, got {kind!r}"])
    warnings = [
        f"{path}: null: kubectl apply drops it, but server-side apply (--server-side, Flux) refuses it unless "
        "the field has a default"
        for path in null_fields(data.get("spec"), "spec")
    ]
    problems: list[str] = []
    if kind == "BenchmarkRun" and "status" in data:
        # The API server drops a status sent to the main resource (only the operator writes it, through the
        # status subresource), but its strict decoding still refuses unknown fields in it.
        data = {key: value for key, value in data.items() if key != "status"}
        problems = [p for p in _problems(BenchmarkRunStatus, doc.data["status"], "status") if _UNKNOWN in p]
    try:
        obj = parse(data, doc.source)
    except InvalidObject as exc:
        return _Checked(doc, problems=exc.problems + problems, warnings=warnings)
    return _Checked(doc, obj=None if problems else obj, problems=problems, warnings=warnings)


def _problems(model: type[BaseModel], value: object, prefix: str) -> list[str]:
    try:
        strict_validate(model, value)
    except InvalidObject as exc:
        return [f"{prefix}.{problem}" if _FIELD.match(problem) else f"{prefix}: {problem}" for problem in exc.problems]
    return []


def _read(name: str) -> _File:
    read, error = read_documents(Path(name))
    documents = [item for doc in read for item in doc.unlisted()]  # kubectl applies a List's items
    out = _File(name, multi=len(documents) > 1 or (error is not None and bool(documents)))
    out.checked = [_check_document(doc) for doc in documents if not doc.empty or doc.refused]
    if error is not None:
        out.error = [f"{error.source}: {problem}" for problem in error.problems]
    elif not out.checked:
        out.error = [f"{name}: no objects in the file (kubectl apply refuses it too)"]
    return out


def admission_problems(
    run: BenchmarkRun, tasks: Mapping[str, BenchmarkTask | None], where: str, *, local: bool = False
) -> list[str]:
    """What the operator's admission would refuse in a schema-valid run (the API server accepts it).

    Mirrors ``mlbench_operator.reconcile.admit``: the task must exist (``tasks``: those of the
    files given, then the catalog's; None for one that failed validation) and be valid, and the
    effective configuration (closed-division overrides, the overridden task's own rules) must
    form. Not checked: the cluster admin's admission policy (allowed images, volumes,
    scheduling), which only the operator's settings know. ``local``: the configuration as
    ``mlbench run --local`` forms it instead (:func:`mlbench_api.config.local_task`).
    """
    name = run.spec.task_ref.name
    if name not in tasks:
        known = ", ".join(sorted(tasks)) or "none"
        return [
            f"spec.taskRef.name: no BenchmarkTask {name!r} in {where} (known: {known}); "
            f"the operator would fail the run {Reason.TASK_NOT_FOUND}"
        ]
    task = tasks[name]
    if task is None:
        why = f"BenchmarkTask {name!r} is invalid (see above); the run would fail {Reason.INVALID_TASK}"
        return [f"spec.taskRef.name: {why}"]
    refused = _config_problem(run, name, local_task(task.spec, run) if local else task.spec)
    if refused is None:
        return []
    problem, reason = refused
    if local:
        return [f"{problem}; `mlbench run --local` would refuse it"]
    hint = ""
    if _config_problem(run, name, local_task(task.spec, run)) is None:
        hint = " (a local run reads an overridden dataset path as it is: `mlbench run --local` runs it; see --local)"
    return [f"{problem}; the operator would fail the run {reason}{hint}"]


def _config_problem(run: BenchmarkRun, name: str, spec: BenchmarkTaskSpec) -> tuple[str, str] | None:
    """Why no configuration forms for ``run`` of task ``spec``, and the reason the operator fails the run
    for it; None when one forms."""
    try:
        effective_config(run, name, spec)
    except OverrideNotAllowed as exc:
        return str(exc), Reason.OVERRIDE_NOT_ALLOWED
    except AlgorithmNotAllowed as exc:
        return str(exc), Reason.ALGORITHM_NOT_ALLOWED
    except ValueError as exc:
        return "; ".join(format_errors(exc)) if isinstance(exc, ValidationError) else str(exc), Reason.INVALID_CONFIG
    return None


def _tasks_in(files: list[_File]) -> dict[str, BenchmarkTask | None]:
    """The tasks the files define, by name; None for one that failed validation."""
    tasks: dict[str, BenchmarkTask | None] = {}
    for checked in (c for f in files for c in f.checked):
        if isinstance(checked.obj, BenchmarkTask):
            tasks[checked.obj.metadata.name] = checked.obj
        elif checked.doc.kind == "BenchmarkTask" and not checked.skipped and isinstance(checked.doc.name, str):
            tasks[checked.doc.name] = None
    return tasks


def sweep_admission_problems(
    sweep: BenchmarkSweep, tasks: Mapping[str, BenchmarkTask | None], where: str, *, local: bool = False
) -> list[str]:
    """What the operator's admission would refuse in the runs a schema-valid sweep creates (a closed task's
    algorithms, overrides): each problem once, with the runs it fails (the API server accepts the sweep, and
    the operator then fails those runs one by one)."""
    failing: dict[str, list[str]] = {}
    for run in expand(sweep):
        for problem in admission_problems(BenchmarkRun.model_validate(run.to_api()), tasks, where, local=local):
            failing.setdefault(_in_sweep(sweep, problem), []).append(run.name)
    out = []
    for problem, names in failing.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out.append(f"{problem} (run{'s' if len(names) > 1 else ''} {shown})")
    return out


def _in_sweep(sweep: BenchmarkSweep, problem: str) -> str:
    """A run's ``spec.<field>...: message`` with the sweep's field that set it: its matrix list when the
    matrix lists it (``spec.matrix.algorithms``), else the template's (``spec.template.overrides``)."""
    match = re.match(r"spec\.(\w+)", problem)
    if match is None:
        return problem
    key = MATRIX_FIELD.get(match.group(1))
    field = f"spec.matrix.{key}" if key in sweep.spec.listed() else f"spec.template.{match.group(1)}"
    return field + problem[match.end() :]


def _admit(files: list[_File], *, local: bool = False) -> None:
    """Add the admission problems of every schema-valid run, and of the runs of every schema-valid sweep: its
    task is one of the files' (as applying them would create it) or the catalog's. ``local``: as
    ``mlbench run --local`` would form them."""
    admitted = [c for f in files for c in f.checked if isinstance(c.obj, BenchmarkRun | BenchmarkSweep)]
    if not admitted:
        return
    given = _tasks_in(files)
    try:
        directory = catalog_dir()
        catalog, where = load_catalog(directory), f"the files given or the catalog ({directory})"
    except FileNotFoundError as exc:  # none found, or $MLBENCH_CATALOG names no folder (said as such)
        found = str(exc) if os.environ.get(CATALOG_ENV) else "no catalog found; set $MLBENCH_CATALOG"
        catalog, where = {}, f"the files given ({found})"
    tasks: dict[str, BenchmarkTask | None] = {**catalog, **given}
    for checked in admitted:
        obj = checked.obj
        if isinstance(obj, BenchmarkSweep):
            checked.problems = sweep_admission_problems(obj, tasks, where, local=local)
            task_name = obj.spec.template.task_ref.name
        else:
            assert isinstance(obj, BenchmarkRun)
            checked.problems = admission_problems(obj, tasks, where, local=local)
            task_name = obj.spec.task_ref.name
        if not checked.problems:
            origin = "the files given" if task_name in given else "the catalog"
            checked.detail = f" (task {task_name} from {origin})"


def _which(doc: Document, multi: bool) -> str:
    """``document 2 (BenchmarkRun r)`` in a file of several documents, else ``BenchmarkRun r``."""
    label = doc.label() if doc.kind else ""
    if not multi:
        return label
    return f"document {doc.index} ({label})" if label else f"document {doc.index}"


def _print(file: _File) -> int:
    """Print the verdicts on one file's documents, in file order; the number that failed."""
    failed = 0
    for checked in file.checked:
        doc = checked.doc
        which = _which(doc, file.multi)
        prefix = f"{which}: " if which else ""
        for warning in doc.warnings():
            print(warning, file=sys.stderr)
        for warning in checked.warnings:
            match = _FIELD.match(warning)
            print(f"{doc.where(match.group(1) if match else '')}: warning: {prefix}{warning}", file=sys.stderr)
        if checked.problems:
            failed += 1
            for problem in checked.problems:
                match = _FIELD.match(problem)
                print(f"{doc.where(match.group(1) if match else '')}: {prefix}{problem}", file=sys.stderr)
        elif checked.obj is None:
            print(f"{doc.where()}: {prefix}skipped: {checked.skipped}")
        else:
            print(f"{doc.where()}: {which}: valid{checked.detail}")
    for line in file.error:
        failed += 1
        print(line, file=sys.stderr)
    return failed


def _validate(args: argparse.Namespace) -> int:
    files = [_read(name) for name in args.files]
    if not args.schema_only:
        _admit(files, local=args.local)
    failed = sum(_print(file) for file in files)
    return EXIT_BAD_INPUT if failed else 0


def _config(args: argparse.Namespace) -> int:
    try:
        config = _effective(args)
        print(
            config.dump() + "\n" if args.output == JSON else dump([config.to_api()], args.output, single=True), end=""
        )
    except (InvalidObject, KeyError, ValueError) as exc:  # ValidationError, an override the task refuses
        raise bad_input(exc, args.run, "BenchmarkRun") from exc
    return 0


def _effective(args: argparse.Namespace) -> RunConfig:
    documents = load_documents(Path(args.run))
    runs = [d for d in documents if d.get("kind") == "BenchmarkRun"]
    if not runs:
        raise InvalidObject(args.run, ["kind: no BenchmarkRun in the file"])
    run = parse_run(runs[0], args.run)
    # A task defined in the same file is the one the run means; otherwise the catalog's.
    local = [parse_task(d, args.run) for d in documents if d.get("kind") == "BenchmarkTask"]
    task = next((t for t in local if t.metadata.name == run.spec.task_ref.name), None)
    if task is None:
        task = get_task(run.spec.task_ref.name)
    spec = local_task(task.spec, run) if args.local else task.spec
    return effective_config(run, task.metadata.name, spec)


def _fetch(args: argparse.Namespace) -> int:
    ref = parse_ref(args.run)
    if ref is None:
        raise BadInput(f"run: expected <namespace>/<run>, got {args.run!r}")
    dest = Path(args.output) if args.output else default_dir(*ref)
    try:
        paths = download(*ref, dest, kubeconfig=args.kubeconfig, context=args.context)
    except (ResultsUnavailable, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


def _watch(args: argparse.Namespace) -> int:
    ref = parse_ref(args.run)
    if ref is None:
        raise BadInput(f"run: expected <namespace>/<run>, got {args.run!r}")
    try:
        return follow(*ref, _say(args.output), kubeconfig=args.kubeconfig, context=args.context)
    except ResultsUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def _say(fmt: str) -> Callable[[str, Mapping[str, Any]], None]:
    """How ``mlbench watch -o FORMAT`` prints a change: its status line, or the run as one line of JSON."""
    if fmt == JSON:
        return lambda _line, obj: print(json.dumps(obj, separators=(",", ":")), flush=True)
    return lambda line, _obj: print(line, flush=True)


def _runner(entry: str, argv: list[str]) -> int:
    try:
        module = importlib.import_module(f"mlbench_runner.{entry}")
    except ImportError as exc:
        print(f"the runner is not installed ({exc}); install with `make install`", file=sys.stderr)
        return 2
    return int(module.main(argv))


def version() -> str:
    """The installed package's version (``pip install`` / ``make install``)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlbench", description="Kubernetes-native distributed ML benchmarks.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("crds", help="generate the CRD YAML from the API models")
    p.add_argument(
        "--output-dir", metavar="DIR", default=str(DEFAULT_CRD_DIR), help="where the CRD YAML goes (default crds/bases)"
    )
    p.add_argument("--check", action="store_true", help="fail if the files differ from the models")
    p.set_defaults(func=_crds)

    p = sub.add_parser("catalog", help="list the task catalog, or print one task")
    p.add_argument("name", nargs="?")
    add_output(p, (TABLE, YAML, JSON), None, "table (default; one task: yaml), yaml or json (all: a v1 List)")
    p.set_defaults(func=_catalog)

    p = sub.add_parser(
        "validate",
        help="check BenchmarkRun/BenchmarkTask YAML as the API server and the operator's admission would",
        description="Check BenchmarkRun/BenchmarkTask YAML without a cluster: what the API server refuses "
        "(strict types, schema and CEL rules) and what the operator's admission refuses (unknown task, a "
        "closed-division override the task does not allow, an invalid effective configuration). Runs find their "
        "task among the files given first, then in the catalog ($MLBENCH_CATALOG).",
    )
    p.add_argument("files", nargs="+", help="YAML or JSON files, one or more documents each")
    p.add_argument(
        "--schema-only",
        action="store_true",
        help="only what the API server checks (kubectl apply --dry-run=server): no task lookup, no admission",
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="admit runs as `mlbench run --local` forms them (an overridden dataset path is read as it is, "
        "the task's dataset source dropped) instead of as the operator does",
    )
    p.set_defaults(func=_validate)

    p = sub.add_parser("config", help="print the effective run configuration of a BenchmarkRun")
    p.add_argument("run")
    p.add_argument("--local", action="store_true", help="as `mlbench run --local` forms it (see validate --local)")
    add_output(p, (JSON, YAML), JSON, "json (default; the file the runner reads) or yaml")
    p.set_defaults(func=_config)

    p = sub.add_parser("fetch", help="download a cluster run's kept results (summary, events, config)")
    p.add_argument("run", help="<namespace>/<run>")
    p.add_argument(
        "--output-dir",
        dest="output",
        metavar="DIR",
        help="directory to write (default mlbench-results/<namespace>.<run>)",
    )
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context", help="kubeconfig context")
    p.set_defaults(func=_fetch)

    p = sub.add_parser(
        "watch",
        help="follow a cluster run until it ends; exit with its outcome (0 Succeeded, 1 Failed)",
        description="Print a cluster run's phase and progress as they change (the Kubernetes watch API), until "
        "it ends. Exit 0 when it Succeeded, 1 when it Failed, 2 for bad input, 3 when it was deleted while "
        "watched, 4 when it cannot be read (not found, forbidden, no cluster).",
    )
    p.add_argument("run", help="<namespace>/<run>")
    add_output(p, (TEXT, JSON), TEXT, "text (default: one status line per change) or json (the run, one line each)")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context", help="kubeconfig context")
    p.set_defaults(func=_watch)

    sub.add_parser("run", help="run a BenchmarkRun (--local: on this machine)", add_help=False)
    sub.add_parser(
        "results", help="tables and plots from result directories or cluster runs (<namespace>/<run>)", add_help=False
    )
    sub.add_parser(
        "sweep", help="expand a BenchmarkSweep: print its runs as YAML, or run them here (--local)", add_help=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("run", "results", "sweep"):
        return _runner({"run": "tools.local", "results": "tools.report", "sweep": "tools.sweep"}[argv[0]], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (InvalidObject, KeyError, ValueError, FileNotFoundError) as exc:  # BadInput is a ValueError
        return report(bad_input(exc), sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
