"""CIFAR-10 from the python pickles, an image folder, or a JPEG tarball of that folder.

The pickles are read with a restricted unpickler (:func:`load_cifar_batch`): the dataset volume is
shared by a namespace's runs, so a planted batch must not become code execution in another
tenant's ranks. Folders and tarballs are decoded once with pillow and cached as ``.npy`` files keyed by
the source's size and mtime, under a file lock so concurrent ranks decode only once.
Images in a folder are ordered round-robin over classes (the i-th file of every class
in turn), so a ``trainSubset`` prefix is class-balanced.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
import tarfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import structlog
from PIL import Image

from mlbench_runner.data.base import (
    DECODER_VERSION,
    UNREADABLE,
    TensorDataset,
    cache_root,
    cached_arrays,
    file_stamp,
)

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
#: ``train|test/<class>/<image>``; not macOS's ``._<name>`` AppleDouble files (resource forks that a tarball made
#: with macOS tar carries beside each image, often under ``__MACOSX/``): they are no images.
_IMAGE = re.compile(r"(?:^|/)(train|test)/([^/]+)/((?!\._)[^/]+\.(?:jpe?g|png))$", re.IGNORECASE)

log = structlog.get_logger("mlbench.data")


#: Images summed at a time by :func:`channel_stats` (a 1024 x 3 x 32 x 32 int64 chunk is 25 MB).
STATS_CHUNK = 1024


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std (0-255 scale) of uint8 NCHW images, in float64. Exact integer sums of the
    values and their squares, a chunk of images at a time: numpy's ``std`` over the whole split made a
    float64 copy of it (with the reshape's copy, about 9x the images: 1.4 GB for CIFAR-10's train split,
    on every rank of every run from the python pickles)."""
    sums = np.zeros(x.shape[1], dtype=np.int64)
    squares = np.zeros(x.shape[1], dtype=np.int64)
    for start in range(0, len(x), STATS_CHUNK):
        part = x[start : start + STATS_CHUNK].astype(np.int64)
        sums += part.sum(axis=(0, 2, 3))
        squares += (part * part).sum(axis=(0, 2, 3))
    n = max(1, x.shape[0] * x.shape[2] * x.shape[3])
    mean = sums / n
    std = np.sqrt(np.maximum(squares / n - mean * mean, 0.0))
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


class UnsafePickleError(pickle.UnpicklingError):
    """A CIFAR-10 batch named a global outside :data:`_ALLOWED` (it was neither imported nor called)."""


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """``numpy.core.multiarray._reconstruct`` as ``ndarray.__reduce__`` uses it: an empty array, filled by BUILD."""
    if subtype is not np.ndarray or shape != (0,):
        raise pickle.UnpicklingError(f"_reconstruct({subtype!r}, {shape!r}): only an empty numpy.ndarray")
    return np.ndarray((0,), dtype=np.dtype(dtype))


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    """``numpy._core.numeric._frombuffer``, which protocol-5 pickles of arrays call (a copy, made writable)."""
    return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape, order=order).copy()


def _latin1(text: Any, encoding: Any) -> bytes:
    """``_codecs.encode(str, 'latin1')``: how Python 3 pickles ``bytes`` at protocols 2 and 3, and nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode(..., {encoding!r}): only latin1 text")
    return text.encode("latin-1")


#: Every global a CIFAR-10 batch may name, with what it resolves to (never an import): the original
#: batches are Python 2 pickles (protocol 2: numpy.core.multiarray._reconstruct, numpy.ndarray,
#: numpy.dtype); copies re-pickled by Python 3 / numpy 2 name numpy._core, call _frombuffer (protocol 5)
#: or _codecs.encode (bytes at protocols 2-3). Dicts, lists, ints and byte strings need no global.
_ALLOWED: dict[tuple[str, str], object] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("_codecs", "encode"): _latin1,
}


class _CifarUnpickler(pickle.Unpickler):
    """Resolves only :data:`_ALLOWED`; any other global (``os.system``, ``builtins.eval``, ...) is refused."""

    def __init__(self, fh: BinaryIO, path: Path) -> None:
        super().__init__(fh, encoding="bytes")
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"dataset.path: {self.path} refers to the global {module}.{name}, which a CIFAR-10 batch never "
                "needs; refused (the file was not loaded: replace it with the original batch)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"dataset.path: {self.path} uses a persistent id, which a CIFAR-10 batch never needs")


def load_cifar_batch(file: Path) -> dict[bytes, Any]:
    """One pickled batch (``data_batch_<i>``, ``test_batch``) through the restricted unpickler, checked.

    Raises :class:`UnsafePickleError` naming the file and the refused global, ``ValueError`` for a
    pickle that loads but is not a batch (``{b"data": uint8 array, b"labels": ints}``).
    """
    with file.open("rb") as fh:
        try:
            batch = _CifarUnpickler(fh, file).load()
        except UnsafePickleError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as err:
            raise ValueError(f"dataset.path: {file} is not a readable CIFAR-10 batch: {err}") from err
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = [repr(k) for k in list(batch)[:8]] if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"dataset.path: {file} is not a CIFAR-10 batch (expected b'data' and b'labels', got {keys})")
    data = batch[b"data"]
    if not isinstance(data, np.ndarray) or data.dtype.kind not in "ui":
        raise ValueError(f"dataset.path: {file}: b'data' must be an integer numpy array, got {type(data).__name__}")
    return batch


def load_cifar_python(path: Path) -> TensorDataset:
    """The standard ``cifar-10-batches-py`` directory (data_batch_1..5, test_batch)."""

    def read(name: str) -> tuple[np.ndarray, np.ndarray]:
        file = path / name
        if not file.exists():
            raise FileNotFoundError(f"dataset.path: {path} has no {name} (not a cifar-10-batches-py folder)")
        batch = load_cifar_batch(file)
        x = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        return x, np.asarray(batch[b"labels"], dtype=np.int64)

    parts = [read(f"data_batch_{i}") for i in range(1, 6)]
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    x_test, y_test = read("test_batch")
    mean, std = channel_stats(x_train)
    return TensorDataset("image", x_train, y_train, x_test, y_test, mean, std, source=str(path))


def _members(path: Path) -> Iterator[tuple[str, bytes]]:
    """(relative name, bytes) of every image file in a folder or tarball."""
    if path.is_dir():
        for name, entry in sorted(_image_entries(path), key=lambda found: found[0]):
            yield name, Path(entry.path).read_bytes()
        return
    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            if member.isfile() and _IMAGE.search(member.name):
                fh = tar.extractfile(member)
                if fh is not None:
                    yield member.name, fh.read()


def _file_name(image: tuple[str, np.ndarray]) -> str:
    """Sort key of a decoded image: its file name only (two equal names must not compare the pixel arrays)."""
    return image[0]


def decode_image_archive(path: Path) -> dict[str, np.ndarray]:
    """Decode every ``train|test/<class>/<file>`` image into uint8 NCHW arrays (split folders in any case)."""
    found: dict[str, dict[str, list[tuple[str, np.ndarray]]]] = {"train": defaultdict(list), "test": defaultdict(list)}
    for name, data in _members(path):
        match = _IMAGE.search(name)
        if not match:
            continue
        split, cls, file = match.groups()
        split = split.lower()  # the pattern ignores case: Train/ and TEST/ are the train and test splits
        try:
            with Image.open(io.BytesIO(data)) as img:
                arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
        except (OSError, ValueError) as exc:  # not an image, or a broken one: which file, not a traceback
            raise ValueError(f"dataset.path: {name} is not an image that can be read ({exc})") from exc
        if arr.shape != (32, 32, 3):
            raise ValueError(f"dataset.path: {name} is {arr.shape[1]}x{arr.shape[0]}, expected 32x32")
        found[split][cls].append((file, arr.transpose(2, 0, 1)))
    classes = sorted(
        set(found["train"]) | set(found["test"]),
        key=lambda c: (c not in CLASSES, CLASSES.index(c) if c in CLASSES else 0, c),
    )
    if not found["train"] or not found["test"]:
        raise ValueError(f"dataset.path: {path} needs both train/<class>/ and test/<class>/ images")
    out: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        per_class = [sorted(found[split][c], key=_file_name) for c in classes]
        xs: list[np.ndarray] = []
        ys: list[int] = []
        for i in range(max(len(p) for p in per_class)):  # round-robin: prefixes stay class-balanced
            for label, files in enumerate(per_class):
                if i < len(files):
                    xs.append(files[i][1])
                    ys.append(label)
        out[f"x_{split}"] = np.stack(xs)
        out[f"y_{split}"] = np.asarray(ys, dtype=np.int64)
    out["classes"] = np.asarray(classes)
    return out


def _cache_dir(path: Path) -> Path:
    """The decoded cache of ``path``: a tarball's is keyed by :func:`file_stamp`; a folder's by its
    resolved location and its files' count, total size and newest mtime. A folder's own mtime changes only
    when an entry directly in it does, so an image replaced or added under ``train/<class>/`` would have
    left the run training on the cached old images (and two folders of one name shared a cache)."""
    if path.is_file():
        stamp = f"{path.name}-{file_stamp(path)}"
    else:
        where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        files = list(_image_stats(path))
        size = sum(st.st_size for st in files)
        # the newest change time as well: unpacking a tarball or `cp -p` restores old mtimes, never ctimes
        newest = max((max(st.st_mtime_ns, st.st_ctime_ns) for st in files), default=0)
        stamp = f"{path.name}-dir-{where}-{len(files)}-{size}-{newest}-v{DECODER_VERSION}"
    return cache_root() / re.sub(r"[^A-Za-z0-9._-]", "_", stamp)


def _is_pickles_tarball(path: Path) -> bool:
    """Whether a tarball's first member lies under ``cifar-10-batches-py/`` (CIFAR-10's python version). Only its
    first header is read."""
    try:
        with tarfile.open(path, "r:*") as tar:
            first = tar.next()
    except UNREADABLE:
        return False  # not a readable tarball: the decoder says why
    return first is not None and first.name.lstrip("./").startswith("cifar-10-batches-py")


def _image_stats(folder: Path) -> Iterator[os.stat_result]:
    """The stat of every image file the loader reads under ``folder`` (:func:`_image_entries`)."""
    for _, entry in _image_entries(folder):
        yield entry.stat(follow_symlinks=True)


def _image_entries(
    folder: Path, prefix: str = "", inside: frozenset[str] = frozenset()
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(relative name, entry) of every image file under ``folder`` (``train|test/<class>/<image>``), one
    ``scandir`` per directory: about 0.2 s for CIFAR-10's 60k files, where ``rglob`` and two stats a file
    took 0.8 s, on every rank of every run. The one walker of both the decoder and the cache key: symlinked
    folders are followed (a class folder linked from elsewhere is part of the dataset; ``rglob`` skipped it
    while the key counted it, and every later class's label shifted), but never one this walk is inside."""
    real = os.path.realpath(folder)
    if real in inside:  # a link to an ancestor: a loop
        return
    inside = inside | {real}
    with os.scandir(folder) as entries:
        for entry in entries:
            name = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=True):
                yield from _image_entries(Path(entry.path), f"{name}/", inside)
            elif entry.is_file(follow_symlinks=True) and _IMAGE.search(name):
                yield name, entry


def load_image_archive(path: Path) -> TensorDataset:
    """An image folder or tarball, via the decoded ``.npy`` cache (in memory if the cache is unusable)."""
    if path.is_file() and _is_pickles_tarball(path):  # else: "needs train/ and test/ images", after decompressing
        raise ValueError(
            f"dataset.path: {path} is the pickled batches' tarball (cifar-10-python); extract it and give the folder"
        )
    keys = ("x_train", "y_train", "x_test", "y_test")

    def decode() -> dict[str, object]:
        arrays = decode_image_archive(path)
        mean, std = channel_stats(arrays["x_train"])
        return {"arrays": {k: arrays[k] for k in keys}, "classes": arrays["classes"].tolist(), "mean": mean, "std": std}

    cached = cached_arrays(_cache_dir(path), path, keys, decode)
    arrays, meta = cached["arrays"], cached["meta"]
    return TensorDataset(
        "image",
        arrays["x_train"],
        arrays["y_train"],
        np.ascontiguousarray(arrays["x_test"]),
        np.ascontiguousarray(arrays["y_test"]),
        tuple(meta["mean"]),
        tuple(meta["std"]),
        source=str(path),
        ingest_seconds=cached["ingest_seconds"],
    )
