"""Which loader a dataset spec needs, and the subsets cut from what it returns.

The dispatch lives here, not in ``base.py``: the format modules import ``base`` for the
shared dataclass and cache, and ``base`` imports none of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from mlbench_api.contract import ENV_DATA_DIR
from mlbench_api.dataspec import DatasetFormat, DatasetSpec
from mlbench_runner import manifest
from mlbench_runner.data import cifar, tabular
from mlbench_runner.data.base import TensorDataset
from mlbench_runner.options import DATASET_VERIFY


def resolve_path(path: str | None) -> Path:
    """The dataset path; falls back to ``$MLBENCH_DATA_DIR/<basename>`` when absent."""
    if path is None:
        raise ValueError("dataset.path: this dataset format needs a path")
    candidate = Path(path).expanduser()
    if candidate.exists():
        return candidate
    data_dir = os.environ.get(ENV_DATA_DIR)
    if data_dir and (Path(data_dir) / candidate.name).exists():
        return Path(data_dir) / candidate.name
    raise FileNotFoundError(f"dataset.path: {path} does not exist (nor under $MLBENCH_DATA_DIR)")


def check_fetched(spec: DatasetSpec, path: Path, required: bool = True) -> None:
    """Refuse data at a sourced dataset's path that its marker and manifest do not vouch for.

    The operator fetches a source into a folder named by its checksum and mounts it, with its marker, read-only
    at ``dataset.path``; the marker records the sha256 (and unpacking) it was verified against and a per-file
    manifest (:mod:`mlbench_runner.manifest`). A missing or unreadable marker, another source's, a marker
    without a manifest, or files that differ from it (sizes; sha256 with ``MLBENCH_DATASET_VERIFY=sha256``)
    fail the run naming the field. ``required=False`` (a local copy found through ``$MLBENCH_DATA_DIR``):
    without a marker there is nothing to compare; one that is there is checked all the same."""
    if spec.source is None:
        return
    marker = manifest.marker_of(path)
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        if not required and not marker.exists():
            return
        raise ValueError(
            f"dataset.source: the data at {path} has no readable fetch marker {marker.name} "
            f"({type(exc).__name__}): it was not fetched and verified by the operator"
        ) from exc
    found = record.get("sha256") if isinstance(record, dict) else None
    if found != spec.source.sha256:
        raise ValueError(
            f"dataset.source.sha256: the data at {path} was fetched from another source (sha256 {found}), not "
            f"this task's ({spec.source.sha256}): a task with another source names the same dataset.path"
        )
    layout = (record.get("unpack"), record.get("stripComponents"))
    if layout != (spec.source.unpack, spec.source.strip_components):
        raise ValueError(
            f"dataset.source.unpack: the data at {path} was laid out as (unpack, stripComponents) = {layout}, "
            f"this task asks for {(spec.source.unpack, spec.source.strip_components)}"
        )
    try:
        manifest.check(path, record, hashes=DATASET_VERIFY.read() == manifest.SHA256)
    except (manifest.ManifestError, OSError) as exc:
        raise ValueError(f"dataset.source: the data at {path} is not what was fetched: {exc}") from exc


def fetched_path(spec: DatasetSpec) -> Path:
    """The dataset's path, resolved and checked against its fetch marker (:func:`check_fetched`): required at
    the declared path (the operator's mount), optional for a copy found through ``$MLBENCH_DATA_DIR``."""
    path = resolve_path(spec.path)
    check_fetched(spec, path, required=spec.path is not None and path == Path(spec.path).expanduser())
    return path


def _is_cifar_python(path: Path) -> bool:
    """The standard pickled batches (``data_batch_1`` here or in ``cifar-10-batches-py/``)."""
    return path.is_dir() and ((path / "data_batch_1").exists() or (path / "cifar-10-batches-py").is_dir())


def load_dataset(spec: DatasetSpec) -> TensorDataset:
    """Load (decoding and caching on first use) and cut to ``trainSubset``."""
    fmt = spec.format
    if fmt is DatasetFormat.SYNTHETIC:
        if spec.synthetic is None:
            raise ValueError("dataset.synthetic: the synthetic format needs a synthetic section")
        ds = tabular.synthetic_epsilon(spec.synthetic)
    elif fmt in (DatasetFormat.CIFAR_PYTHON, DatasetFormat.IMAGE_FOLDER, DatasetFormat.IMAGE_TARBALL):
        # The format names the family; the path decides the layout, so pointing a task at
        # another copy of CIFAR-10 (overrides.dataset) needs no format change.
        path = fetched_path(spec)
        if _is_cifar_python(path):
            nested = path / "cifar-10-batches-py"
            ds = cifar.load_cifar_python(nested if nested.is_dir() else path)
        else:
            ds = cifar.load_image_archive(path)
    elif fmt is DatasetFormat.LIBSVM:
        ds = tabular.load_libsvm_dataset(fetched_path(spec))
    elif fmt is DatasetFormat.NPZ:
        ds = tabular.load_npz(fetched_path(spec))
    else:  # pragma: no cover - the enum is closed
        raise ValueError(f"dataset.format: unsupported {fmt}")
    if spec.test_subset is not None:
        if spec.test_subset > len(ds.y_test):
            raise ValueError(f"dataset.testSubset: {spec.test_subset} exceeds the {len(ds.y_test)} test samples")
        ds.x_test = np.ascontiguousarray(ds.x_test[: spec.test_subset])
        ds.y_test = np.ascontiguousarray(ds.y_test[: spec.test_subset])
    if spec.train_subset is not None:
        if spec.train_subset > len(ds.y_train):
            raise ValueError(f"dataset.trainSubset: {spec.train_subset} exceeds the {len(ds.y_train)} training samples")
        ds.x_train = np.ascontiguousarray(ds.x_train[: spec.train_subset])
        ds.y_train = np.ascontiguousarray(ds.y_train[: spec.train_subset])
    return ds
