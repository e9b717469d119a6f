"""What every dataset format shares: the in-memory :class:`TensorDataset` and the ``.npy`` cache.

The format modules (``cifar``, ``tabular``) import this one; it imports none of its siblings (the
dispatch from a DatasetSpec to a format is :mod:`mlbench_runner.data.loader`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tarfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog


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


#: Part of every archive's cache key: bump when a decoder's output changes (a parser fix), so that caches made by
#: the older decoder are not read as this one's.
DECODER_VERSION = 2
#: What a decoder raises for a source it cannot read: a broken or truncated archive, a file that is no image.
UNREADABLE = (OSError, EOFError, tarfile.TarError, zlib.error)


def cache_root() -> Path:
    """``${MLBENCH_CACHE:-~/.cache/mlbench}/datasets``: where decoded datasets are kept."""
    return Path(os.environ.get("MLBENCH_CACHE", Path.home() / ".cache" / "mlbench")) / "datasets"


def file_stamp(path: Path) -> str:
    """A source file's part of a cache key: where it is, its size, its modification and change times, and the
    decoders' version. Size and mtime alone let a corrected archive of the same (block-padded) size copied with
    its mtime kept (``cp -p``, ``rsync -t``), or another copy of the same name, be served the old cache."""
    st = path.stat()
    where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    return f"{where}-{st.st_size}-{st.st_mtime_ns}-{st.st_ctime_ns}-v{DECODER_VERSION}"


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

    def decode_source() -> dict[str, Any]:
        """``decode()``, its errors about the source said as such: an OSError from it is not the cache's (which
        would decode it again, minutes for epsilon, and then show a traceback that names no field)."""
        try:
            return decode()
        except UNREADABLE as exc:
            raise ValueError(f"dataset.path: {source} cannot be read: {type(exc).__name__}: {exc}") from exc

    def fallback(decoded: dict[str, Any]) -> dict[str, Any]:
        return {"arrays": decoded["arrays"], "meta": decoded, "ingest_seconds": time.perf_counter() - start}

    try:
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the first rank decodes, the others wait and read
            if not meta_file.exists():
                log.info("dataset_decode", source=str(source), cache=str(cache))
                decoded = decode_source()
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
                del decoded  # saved: read back below, not held twice (8 GB instead of 4 for epsilon)
        ingest = 0.0 if hit else time.perf_counter() - start
        meta = json.loads(meta_file.read_text())
        arrays = {k: np.load(cache / f"{k}.npy", mmap_mode="r" if mmap else None) for k in keys}
    except OSError as exc:
        log.warning("dataset_cache_unusable", cache=str(cache), error=str(exc), fallback="in-memory")
        return fallback(decode_source())
    return {"arrays": arrays, "meta": meta, "ingest_seconds": ingest}
