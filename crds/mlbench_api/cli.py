"""``mlbench``: the user's command line.

API commands (crds, catalog, validate, config) live here and need neither torch nor a
cluster; ``run`` and ``results`` hand over to the runner package, imported lazily so the
operator image never needs torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from mlbench_api.catalog import get_task, load_catalog, load_documents, parse_run, parse_task
from mlbench_api.config import effective_config
from mlbench_api.crdgen import stale, write_all
from mlbench_api.errors import InvalidObject

DEFAULT_CRD_DIR = Path(__file__).resolve().parents[1] / "bases"


def _crds(args: argparse.Namespace) -> int:
    directory = Path(args.out)
    if args.check:
        outdated = stale(directory)
        if outdated:
            print("stale CRDs (run `make crds`): " + ", ".join(outdated), file=sys.stderr)
            return 1
        print(f"CRDs in {directory} are up to date")
        return 0
    for path in write_all(directory):
        print(path)
    return 0


def _catalog(args: argparse.Namespace) -> int:
    tasks = load_catalog()
    if args.name:
        print(yaml.safe_dump(get_task(args.name).to_api(), sort_keys=False), end="")
        return 0
    print(f"{'TASK':<28} {'DIVISION':<8} {'MODEL':<24} {'DATASET':<18} {'BATCH':>5} {'EPOCHS':>6} {'TARGET':>6}")
    for name, task in sorted(tasks.items()):
        s = task.spec
        model = s.model.name.value + (f"-{s.model.depth}{s.model.version}" if s.model.depth else "")
        print(
            f"{name:<28} {s.division.value:<8} {model:<24} {s.dataset.name:<18} "
            f"{s.training.batch_size_per_worker:>5} {s.training.max_epochs:>6} {s.goal.target:>6.0%}"
        )
    return 0


def _validate(args: argparse.Namespace) -> int:
    failed = 0
    for name in args.files:
        for doc in load_documents(Path(name)):
            kind = doc.get("kind")
            try:
                if kind == "BenchmarkRun":
                    parse_run(doc, name)
                elif kind == "BenchmarkTask":
                    parse_task(doc, name)
                else:
                    raise InvalidObject(name, [f"kind: expected BenchmarkRun or BenchmarkTask, got {kind!r}"])
                print(f"{name}: {kind} {doc.get('metadata', {}).get('name')} is valid")
            except InvalidObject as exc:
                failed += 1
                for problem in exc.problems:
                    print(f"{name}: {problem}", file=sys.stderr)
    return 1 if failed else 0


def _config(args: argparse.Namespace) -> int:
    docs = [d for d in load_documents(Path(args.run)) if d.get("kind") == "BenchmarkRun"]
    if not docs:
        raise InvalidObject(args.run, ["kind: no BenchmarkRun in the file"])
    run = parse_run(docs[0], args.run)
    task = get_task(run.spec.task_ref.name)
    print(effective_config(run, task.metadata.name, task.spec).dump())
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from mlbench_api.download import ResultsUnavailable, default_dir, download, parse_ref

    ref = parse_ref(args.run)
    if ref is None:
        print(f"error: run: expected <namespace>/<run>, got {args.run!r}", file=sys.stderr)
        return 2
    dest = Path(args.output) if args.output else default_dir(*ref)
    try:
        paths = download(*ref, dest, kubeconfig=args.kubeconfig, context=args.context)
    except (ResultsUnavailable, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


def _runner(entry: str, argv: list[str]) -> int:
    try:
        import importlib

        module = importlib.import_module(f"mlbench_runner.{entry}")
    except ImportError as exc:
        print(f"the runner is not installed ({exc}); install with `make install`", file=sys.stderr)
        return 2
    return int(module.main(argv))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlbench", description="Kubernetes-native distributed ML benchmarks.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("crds", help="generate the CRD YAML from the API models")
    p.add_argument("--out", default=str(DEFAULT_CRD_DIR))
    p.add_argument("--check", action="store_true", help="fail if the files differ from the models")
    p.set_defaults(func=_crds)

    p = sub.add_parser("catalog", help="list the task catalog, or print one task")
    p.add_argument("name", nargs="?")
    p.set_defaults(func=_catalog)

    p = sub.add_parser("validate", help="validate BenchmarkRun/BenchmarkTask YAML without a cluster")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=_validate)

    p = sub.add_parser("config", help="print the effective run configuration of a BenchmarkRun")
    p.add_argument("run")
    p.set_defaults(func=_config)

    p = sub.add_parser("fetch", help="download a cluster run's kept results (summary, events, config)")
    p.add_argument("run", help="<namespace>/<run>")
    p.add_argument("-o", "--output", help="directory to write (default mlbench-results/<namespace>.<run>)")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context", help="kubeconfig context")
    p.set_defaults(func=_fetch)

    sub.add_parser("run", help="run a BenchmarkRun (--local: on this machine)", add_help=False)
    sub.add_parser(
        "results", help="tables and plots from result directories or cluster runs (<namespace>/<run>)", add_help=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("run", "results"):
        return _runner({"run": "local", "results": "report"}[argv[0]], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (InvalidObject, KeyError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
