"""Dispatch a task's DatasetSpec to the right loader and apply ``trainSubset``."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

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
    #: one-time reformatting (decoding into the cache) done or waited for while loading
    ingest_seconds: float = 0.0

    @property
    def features(self) -> int:
        return int(np.prod(self.x_train.shape[1:]))


def cache_root() -> Path:
    """``${MLBENCH_CACHE:-~/.cache/mlbench}/datasets``: where decoded datasets are kept."""
    return Path(os.environ.get("MLBENCH_CACHE", Path.home() / ".cache" / "mlbench")) / "datasets"


log = structlog.get_logger("mlbench.data")


def cached_arrays(
    cache: Path, source: Path, keys: Sequence[str], decode: Callable[[], dict[str, Any]], *, mmap: bool = True
) -> dict[str, Any]:
    """``{"arrays": {key: ndarray}, "meta": {...}, "ingest_seconds": s}`` from the ``.npy`` cache.

    ``decode()`` returns ``{"arrays": {...}, **meta}``; it runs once, under a file lock so that
    concurrent ranks decode only once, and its arrays are saved as ``<key>.npy`` (memory-mapped
    on later reads) with ``meta.json`` written last (its presence means the cache is complete).
    When the cache directory cannot be used (not writable, e.g. a root-owned
    ``$MLBENCH_CACHE`` in a pod running as another user; disk full) the data is decoded
    in memory with a warning instead of failing the run.

    ``ingest_seconds`` is the one-time reformatting this call did or waited for (another rank
    decoding under the lock): from entry to the cache being complete, 0 on a cache hit. The
    trainer leaves it out of the run's wall clock (docs/runner.md, "one-time ingest").
    """
    meta_file = cache / "meta.json"
    start = time.perf_counter()
    hit = meta_file.exists()

    def fallback(decoded: dict[str, Any]) -> dict[str, Any]:
        return {"arrays": decoded["arrays"], "meta": decoded, "ingest_seconds": time.perf_counter() - start}

    try:
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the first rank decodes, the others wait and read
            if not meta_file.exists():
                log.info("dataset_decode", source=str(source), cache=str(cache))
                decoded = decode()
                try:
                    for key in keys:
                        np.save(cache / f"{key}.npy", decoded["arrays"][key])
                    tmp = meta_file.with_suffix(".tmp")
                    tmp.write_text(
                        json.dumps({k: v for k, v in decoded.items() if k != "arrays"} | {"source": str(source)})
                    )
                    tmp.rename(meta_file)
                except OSError as exc:
                    log.warning("dataset_cache_unwritable", cache=str(cache), error=str(exc), fallback="in-memory")
                    return fallback(decoded)
        ingest = 0.0 if hit else time.perf_counter() - start
        meta = json.loads(meta_file.read_text())
        arrays = {k: np.load(cache / f"{k}.npy", mmap_mode="r" if mmap else None) for k in keys}
    except OSError as exc:
        log.warning("dataset_cache_unusable", cache=str(cache), error=str(exc), fallback="in-memory")
        return fallback(decode())
    return {"arrays": arrays, "meta": meta, "ingest_seconds": ingest}


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
