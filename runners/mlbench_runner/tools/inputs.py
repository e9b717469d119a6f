"""What ``mlbench run <run.yaml> --local`` runs: the run's YAML, its task (the catalog's or ``--task-file``'s),
resolved as the operator resolves them into a RunConfig (:func:`build_config`), and its data looked for here
(:func:`prepare_data`). Bad input is a :class:`LocalRunError`, reported as ``mlbench validate`` reports one."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlbench_api import BenchmarkRun, BenchmarkTask, BenchmarkTaskSpec, RunConfig, catalog
from mlbench_api.badinput import BadInput, bad_input
from mlbench_api.common import API_VERSION
from mlbench_api.config import effective_config, local_task
from mlbench_api.dataspec import DatasetFormat
from mlbench_api.errors import InvalidObject
from mlbench_api.run import MAX_WORKERS

#: The highest TCP port.
MAX_PORT = 65535


class LocalRunError(BadInput):
    """A problem with the user's input (its file, its flags, its data), reported as ``mlbench validate`` reports one."""


def _invalid(kind: str, exc: InvalidObject) -> LocalRunError:
    return LocalRunError(exc.problems, exc.source, kind)


def _documents(path: str, kind: str) -> list[dict[str, Any]]:
    """The documents of a YAML file, read as ``kubectl apply`` reads them (go-yaml's types)."""
    try:
        return catalog.load_documents(Path(path))
    except InvalidObject as exc:
        raise LocalRunError(exc.problems, exc.source, kind) from exc


def load_run(path: str) -> BenchmarkRun:
    """The file's BenchmarkRun, checked as strictly as ``mlbench validate`` and the API server check it
    (``workers: "4"`` is a string and refused), so a local run accepts exactly what a cluster accepts."""
    runs = [d for d in _documents(path, "BenchmarkRun") if d.get("kind") == "BenchmarkRun"]
    if not runs:
        raise LocalRunError("kind: expected a BenchmarkRun document", path)
    try:
        return catalog.parse_run(runs[0], path)
    except InvalidObject as exc:
        raise _invalid("BenchmarkRun", exc) from exc


def pick_task(name: str, tasks: Sequence[BenchmarkTask], source: str) -> BenchmarkTask:
    """The task named ``name`` among a task file's tasks.

    The run's results are filed under ``spec.taskRef.name``: running another task under that name
    would file, say, ResNet-20's results as a logistic regression's, so a mismatch is refused.
    """
    for task in tasks:
        if task.metadata.name == name:
            return task
    found = ", ".join(repr(t.metadata.name) for t in tasks) or "none"
    raise LocalRunError(
        f"metadata.name: the file's BenchmarkTask is {found}, but the run's spec.taskRef.name is "
        f"{name!r}; use a task file that defines {name!r} or change spec.taskRef.name",
        source,
        "BenchmarkTask",
    )


def load_task(name: str, task_file: str | None) -> BenchmarkTaskSpec:
    """The task from ``--task-file`` (the BenchmarkTask named ``name``, or a bare spec) or the catalog."""
    if task_file:
        docs = _documents(task_file, "task")
        tasks = [d for d in docs if d.get("kind") == "BenchmarkTask"]
        try:
            if not tasks and len(docs) == 1 and "kind" not in docs[0]:  # a bare BenchmarkTaskSpec: no name
                return catalog.strict_validate(BenchmarkTaskSpec, docs[0], task_file)
            return pick_task(name, [catalog.parse_task(d, task_file) for d in tasks], task_file).spec
        except InvalidObject as exc:
            raise _invalid("BenchmarkTask", exc) from exc

    try:
        task = catalog.get_task(name)
    except KeyError as exc:
        raise LocalRunError(str(exc.args[0])) from exc
    except InvalidObject as exc:
        raise LocalRunError(exc.problems, exc.source, "BenchmarkTask") from exc
    except (OSError, ValueError) as exc:
        raise LocalRunError(f"task catalog: {exc}") from exc
    return task.spec


def task_document(name: str, task_file: str) -> dict[str, Any]:
    """The BenchmarkTask ``name`` of a task file as a document (a bare spec gets that name), checked as
    :func:`load_task` checks it: what a run's own file can carry so that it runs on its own."""
    spec = load_task(name, task_file)
    return {"apiVersion": API_VERSION, "kind": "BenchmarkTask", "metadata": {"name": name}, "spec": spec.to_api()}


def task_file_for(name: str, task_file: str | None, beside: str) -> str | None:
    """Where task ``name`` comes from: ``--task-file``; else the run's (or sweep's) own file ``beside`` when it
    also holds that BenchmarkTask (one file that ``kubectl apply`` takes whole); else None: the catalog."""
    if task_file:
        return task_file
    docs = _documents(beside, "task")
    named = [d for d in docs if d.get("kind") == "BenchmarkTask" and (d.get("metadata") or {}).get("name") == name]
    return beside if named else None


def build_config(args: argparse.Namespace, out: Path) -> RunConfig:
    run = load_run(args.run)
    name = run.spec.task_ref.name
    task = load_task(name, task_file_for(name, args.task_file, args.run))
    try:
        spec = local_task(task, run)
    except ValueError as exc:  # the overrides break the task's own rules
        raise LocalRunError(bad_input(exc).problems, args.run, "BenchmarkRun") from exc
    if args.ranks is not None:
        if not 1 <= args.ranks <= MAX_WORKERS:  # becomes spec.workers, whose bounds model_copy does not check
            raise LocalRunError(f"--ranks: must be from 1 to {MAX_WORKERS} (spec.workers' range), got {args.ranks}")
        if args.ranks != run.spec.workers * run.spec.slots_per_worker:
            run = run.model_copy(
                update={"spec": run.spec.model_copy(update={"workers": args.ranks, "slots_per_worker": 1})}
            )
    try:
        config = effective_config(
            run,
            run.spec.task_ref.name,
            spec,
            output_dir=str(out),
            metrics_port=args.metrics_port,
            checkpoint_dir=str(Path(args.checkpoint).resolve()) if getattr(args, "checkpoint", None) else None,
        )
    except ValueError as exc:  # an override the task refuses or that breaks its rules, an invalid configuration
        raise LocalRunError(bad_input(exc).problems, args.run, "BenchmarkRun") from exc
    if config.metrics_port and config.metrics_port + config.world_size - 1 > MAX_PORT:
        raise LocalRunError(
            f"--metrics-port: rank r serves on {config.metrics_port} + r, beyond {MAX_PORT} for "
            f"{config.world_size} ranks"
        )
    if config.backend.value == "nccl":
        # Lazy: this command imports torch only to count an nccl run's GPUs (the ranks train).
        import torch  # noqa: PLC0415

        if torch.cuda.device_count() < config.world_size:
            raise LocalRunError(
                f"spec.backend: nccl needs {config.world_size} GPUs here, found {torch.cuda.device_count()}"
            )
    return config


def prepare_data(config: RunConfig, say: Any) -> None:
    """Decode an image archive or LIBSVM files once here, so the ranks start from the cache.

    Either way the one-time decoding is outside the run's wall clock (the trainer leaves
    out any decoding it has to do itself), so both paths report the same kind of time.
    """
    if not config.task.has_training:  # a collectives task (0a) has no data
        return
    ds = config.task.dataset
    if ds.format in (DatasetFormat.IMAGE_TARBALL, DatasetFormat.IMAGE_FOLDER, DatasetFormat.LIBSVM):
        # Lazy: the decoders need numpy, which `mlbench sweep` (importing this module) lacks on the cli extra.
        from mlbench_runner.data.cifar import load_image_archive  # noqa: PLC0415
        from mlbench_runner.data.loader import resolve_path  # noqa: PLC0415
        from mlbench_runner.data.tabular import load_libsvm_dataset  # noqa: PLC0415

        t0 = time.perf_counter()
        try:
            path = resolve_path(ds.path)
        except FileNotFoundError as exc:
            raise LocalRunError(str(exc)) from exc
        try:
            if ds.format is DatasetFormat.LIBSVM:
                load_libsvm_dataset(path)
            else:
                load_image_archive(path)
        except (FileNotFoundError, ValueError) as exc:
            raise LocalRunError(str(exc)) from exc
        say(f"dataset ready: {path} ({time.perf_counter() - t0:.1f}s)")


def model_text(model: Any) -> str:
    """The event's model for a person: ``resnet (version=m1, depth=20)``, not a Python dict."""
    if not isinstance(model, dict):
        return str(model)
    rest = ", ".join(f"{k}={v}" for k, v in model.items() if k != "name")
    name = str(model.get("name", "model"))
    return f"{name} ({rest})" if rest else name
