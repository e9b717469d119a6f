"""A CIFAR-10 *python-format* archive (``cifar-10-python.tar.gz``: ``cifar-10-batches-py/data_batch_1..5``,
``test_batch``, ``batches.meta``, pickled as the original) made from the JPEG copy of CIFAR-10 in
``../shared/datasets/cifar10-jpeg.tar.gz`` (``train|test/<class>/<n>.jpg``), so that the public smoke task runs
on its own format without a download. A JPEG copy, not the original pixels, and a subset: its sha256 is not the
public archive's (a run points at it with ``spec.overrides.datasetSource``, as a user without internet would)."""

from __future__ import annotations

import io
import pickle
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TOP = "cifar-10-batches-py"
TRAIN_BATCHES = 5


def _decode(tar: tarfile.TarFile, member: tarfile.TarInfo) -> np.ndarray:
    fh = tar.extractfile(member)
    if fh is None:
        raise ValueError(f"{member.name}: not a file")
    with Image.open(io.BytesIO(fh.read())) as img:
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


def read_jpegs(source: Path, per_class: dict[str, int]) -> dict[str, dict[str, list[tuple[str, np.ndarray]]]]:
    """The first ``per_class[split]`` images of each class of each split, in the archive's order, as HWC arrays
    (read in one pass: a gzip stream does not seek back cheaply)."""
    found: dict[str, dict[str, list[tuple[str, np.ndarray]]]] = {split: defaultdict(list) for split in per_class}
    with tarfile.open(source, "r:*") as tar:
        for member in tar:
            if not member.isfile() or member.name.count("/") != 2:
                continue
            split, cls, name = member.name.split("/")
            if split in per_class and cls in CLASSES and len(found[split][cls]) < per_class[split]:
                found[split][cls].append((name, _decode(tar, member)))
    for split, want in per_class.items():
        short = {cls: len(found[split][cls]) for cls in CLASSES if len(found[split][cls]) < want}
        if short:
            raise ValueError(f"{source}: too few {split} images of {short} (want {want} of each)")
    return found


def interleave(by_class: dict[str, list[tuple[str, np.ndarray]]]) -> list[tuple[int, str, np.ndarray]]:
    """(label, file name, image) one class after another in turn, so that every prefix is class-balanced."""
    rows = [list(by_class[cls]) for cls in CLASSES]
    return [(label, *rows[label][i]) for i in range(len(rows[0])) for label in range(len(CLASSES))]


def batch(label: str, items: list[tuple[int, str, np.ndarray]]) -> bytes:
    """One batch as the original's pickle: ``b"data"`` N x 3072 uint8 (R, G, B planes), ``b"labels"``, names."""
    data = np.stack([img.transpose(2, 0, 1).reshape(-1) for _, _, img in items]).astype(np.uint8)
    body = {
        b"batch_label": label.encode(),
        b"labels": [lab for lab, _, _ in items],
        b"data": data,
        b"filenames": [f"{CLASSES[lab]}_{name}".encode() for lab, name, _ in items],
    }
    return pickle.dumps(body, protocol=2)


def write_archive(source: Path, out: Path, train_per_class: int, test_per_class: int) -> Path:
    """``out`` (a .tar.gz): ``train_per_class`` x 10 training images in five batches, ``test_per_class`` x 10 test."""
    if train_per_class % TRAIN_BATCHES:
        raise ValueError(f"train_per_class={train_per_class}: not a multiple of {TRAIN_BATCHES} batches")
    images = read_jpegs(source, {"train": train_per_class, "test": test_per_class})
    train, test = interleave(images["train"]), interleave(images["test"])
    size = len(train) // TRAIN_BATCHES
    files = {
        f"data_batch_{i + 1}": batch(f"training batch {i + 1} of 5", train[i * size : (i + 1) * size])
        for i in range(TRAIN_BATCHES)
    }
    files["test_batch"] = batch("testing batch 1 of 1", test)
    meta = {b"label_names": [c.encode() for c in CLASSES], b"num_cases_per_batch": size, b"num_vis": 3072}
    files["batches.meta"] = pickle.dumps(meta, protocol=2)
    with tarfile.open(out, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{TOP}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out
