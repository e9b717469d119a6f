"""Dispatch a task's DatasetSpec to the right loader and apply ``trainSubset``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlbench_api.task import DatasetFormat, DatasetSpec


@dataclass
class TensorDataset:
    """Train and test arrays in memory.

    Images are uint8 NCHW with per-channel ``mean``/``std`` (0-255 scale) of the full
    training split; tabular data is float features with labels in {-1, +1}.
    """

    kind: str  # "image" or "tabular"
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    source: str = ""

    @property
    def features(self) -> int:
        return int(np.prod(self.x_train.shape[1:]))


def cache_root() -> Path:
    """``${MLBENCH_CACHE:-~/.cache/mlbench}/datasets``: where decoded datasets are kept."""
    return Path(os.environ.get("MLBENCH_CACHE", Path.home() / ".cache" / "mlbench")) / "datasets"


def resolve_path(path: str | None) -> Path:
    """The dataset path; falls back to ``$MLBENCH_DATA_DIR/<basename>`` when absent."""
    if path is None:
        raise ValueError("dataset.path: this dataset format needs a path")
    candidate = Path(path).expanduser()
    if candidate.exists():
        return candidate
    data_dir = os.environ.get("MLBENCH_DATA_DIR")
    if data_dir and (Path(data_dir) / candidate.name).exists():
        return Path(data_dir) / candidate.name
    raise FileNotFoundError(f"dataset.path: {path} does not exist (nor under $MLBENCH_DATA_DIR)")


def _is_cifar_python(path: Path) -> bool:
    """The standard pickled batches (``data_batch_1`` here or in ``cifar-10-batches-py/``)."""
    return path.is_dir() and ((path / "data_batch_1").exists() or (path / "cifar-10-batches-py").is_dir())


def load_dataset(spec: DatasetSpec) -> TensorDataset:
    """Load (decoding and caching on first use) and cut to ``trainSubset``."""
    from mlbench_runner.data import cifar, tabular

    fmt = spec.format
    if fmt is DatasetFormat.SYNTHETIC:
        if spec.synthetic is None:
            raise ValueError("dataset.synthetic: the synthetic format needs a synthetic section")
        ds = tabular.synthetic_epsilon(spec.synthetic)
    elif fmt in (DatasetFormat.CIFAR_PYTHON, DatasetFormat.IMAGE_FOLDER, DatasetFormat.IMAGE_TARBALL):
        # The format names the family; the path decides the layout, so pointing a task at
        # another copy of CIFAR-10 (overrides.dataset) needs no format change.
        path = resolve_path(spec.path)
        if _is_cifar_python(path):
            nested = path / "cifar-10-batches-py"
            ds = cifar.load_cifar_python(nested if nested.is_dir() else path)
        else:
            ds = cifar.load_image_archive(path)
    elif fmt is DatasetFormat.LIBSVM:
        ds = tabular.load_libsvm_dataset(resolve_path(spec.path))
    elif fmt is DatasetFormat.NPZ:
        ds = tabular.load_npz(resolve_path(spec.path))
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
