"""The official task catalog, loadable with or without a cluster.

The catalog is plain ``BenchmarkTask`` YAML under ``manifests/catalog`` (also applied to
clusters with kustomize), so the local runner and the operator read the same numbers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mlbench_api.errors import InvalidObject, format_errors
from mlbench_api.run import BenchmarkRun
from mlbench_api.task import BenchmarkTask

CATALOG_ENV = "MLBENCH_CATALOG"
_CANDIDATES = (
    Path(__file__).resolve().parents[2] / "manifests" / "catalog",  # a source checkout
    Path("/etc/mlbench/catalog"),  # the runner image
)


def catalog_dir() -> Path:
    """Where the catalog lives: ``$MLBENCH_CATALOG``, the checkout, or the image."""
    env = os.environ.get(CATALOG_ENV)
    if env:
        return Path(env)
    for candidate in _CANDIDATES:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no task catalog found; set {CATALOG_ENV} to a directory of BenchmarkTask YAML")


def load_documents(path: Path) -> list[dict[str, Any]]:
    """All YAML documents in a file, skipping empty ones."""
    with path.open() as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def parse_task(doc: dict[str, Any], source: str = "<input>") -> BenchmarkTask:
    try:
        return BenchmarkTask.model_validate(doc)
    except ValidationError as exc:
        raise InvalidObject(source, format_errors(exc)) from exc


def parse_run(doc: dict[str, Any], source: str = "<input>") -> BenchmarkRun:
    try:
        return BenchmarkRun.model_validate(doc)
    except ValidationError as exc:
        raise InvalidObject(source, format_errors(exc)) from exc


def load_catalog(directory: Path | None = None) -> dict[str, BenchmarkTask]:
    """Every task in the catalog by name; invalid files fail loudly with the field named."""
    directory = directory or catalog_dir()
    tasks: dict[str, BenchmarkTask] = {}
    for path in sorted(directory.glob("*.yaml")):
        for doc in load_documents(path):
            if doc.get("kind") != "BenchmarkTask":
                continue
            task = parse_task(doc, str(path))
            if task.metadata.name in tasks:
                raise InvalidObject(str(path), [f"metadata.name: duplicate task {task.metadata.name!r}"])
            tasks[task.metadata.name] = task
    return tasks


def get_task(name: str, directory: Path | None = None) -> BenchmarkTask:
    tasks = load_catalog(directory)
    try:
        return tasks[name]
    except KeyError:
        known = ", ".join(sorted(tasks)) or "none"
        raise KeyError(f"spec.taskRef.name: no task {name!r} in the catalog (known: {known})") from None
