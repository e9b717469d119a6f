"""Where a sourced dataset lives on the namespace's dataset volume, and how the workers see it.

Content-addressed: the fetch Job writes ``/data/<store name>`` (:func:`mlbench_api.datasets.store_name`, from
the source's sha256 and layout) and its marker beside it; no path a task or run chooses is ever written. The
workers mount that folder (or file) and its marker, read-only, at the task's ``dataset.path``: the path is
only where the data appears in the container, so it names no other dataset's files.
"""

from __future__ import annotations

from typing import Any

from mlbench_api import contract
from mlbench_api.datasets import MARKER_SUFFIX, store_name
from mlbench_api.dataspec import DatasetSource, DatasetSpec

Obj = dict[str, Any]
#: The pod volume that holds the dataset (the workers' and the fetch Job's).
VOLUME = "data"


def sourced(dataset: DatasetSpec) -> tuple[DatasetSource, str]:
    """The source and path of a dataset the operator fetches (the API guarantees a path with a source)."""
    if dataset.source is None or dataset.path is None:
        raise ValueError(f"dataset {dataset.name!r} has no source to fetch")
    return dataset.source, dataset.path


def store_entry(source: DatasetSource) -> str:
    """The data's name at the volume's root."""
    return store_name(source.sha256, source.unpack, source.strip_components)


def fetch_dest(source: DatasetSource) -> str:
    """Where the fetch Job (the volume mounted read-write at /data) writes the data."""
    return f"{contract.DATA_DIR}/{store_entry(source)}"


def worker_mounts(source: DatasetSource, path: str) -> list[Obj]:
    """The data and its marker, read-only, at ``path`` and ``path`` + the marker suffix (what the loader reads)."""
    entry = store_entry(source)
    return [
        {"name": VOLUME, "mountPath": path, "subPath": entry, "readOnly": True},
        {"name": VOLUME, "mountPath": path + MARKER_SUFFIX, "subPath": entry + MARKER_SUFFIX, "readOnly": True},
    ]
