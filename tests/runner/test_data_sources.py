"""Dataset sources as users have them: linked class folders, tarballs made on macOS, broken archives, replaced
archives of the same size, npz files that are not a binary task. Each is read right or refused naming the file."""

from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from mlbench_api.dataspec import DatasetSpec
from mlbench_runner.data import cifar as cifar_module
from mlbench_runner.data import load_dataset
from mlbench_runner.data.tabular import load_npz

CLASSES = ("airplane", "automobile")


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))


def _png(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((32, 32, 3), value, dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _folder(root: Path, images: int = 2) -> Path:
    """train|test/<class>/<n>.png with the class's value (0 for airplane, 100 for automobile)."""
    for split in ("train", "test"):
        for c, cls in enumerate(CLASSES):
            (root / split / cls).mkdir(parents=True)
            for i in range(images):
                (root / split / cls / f"{i}.png").write_bytes(_png(100 * c))
    return root


def _tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _spec(path: Path, fmt: str = "image-folder") -> DatasetSpec:
    return DatasetSpec.model_validate({"name": "t", "format": fmt, "path": str(path)})


def test_a_linked_class_folder_is_read_with_its_label(tmp_path: Path) -> None:
    """A class folder linked from elsewhere: its images are the dataset's (the key counted them while the
    decoder skipped them, and the next class took its label)."""
    root = _folder(tmp_path / "data")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for split in ("train", "test"):
        (root / split / "airplane").rename(elsewhere / split)
        (root / split / "airplane").symlink_to(elsewhere / split, target_is_directory=True)
    (root / "train" / "loop").symlink_to(root, target_is_directory=True)  # a link to an ancestor: not followed
    ds = load_dataset(_spec(root))
    assert ds.y_train.tolist() == [0, 1, 0, 1]
    assert ds.x_train[:, 0, 0, 0].tolist() == [0, 100, 0, 100]
    assert ds.y_test.tolist() == [0, 1, 0, 1]


def test_macos_resource_forks_in_a_tarball_are_not_images(tmp_path: Path) -> None:
    """macOS tar stores ``._<name>`` beside each file (and under ``__MACOSX/``): not images, not refused."""
    members = {f"{s}/{c}/0.png": _png(100 * i) for s in ("train", "test") for i, c in enumerate(CLASSES)}
    members |= {
        f"__MACOSX/{s}/{c}/._0.png": b"\x00\x05\x16\x07 not an image" for s in ("train", "test") for c in CLASSES
    }
    members |= {"train/airplane/._0.png": b"\x00\x05\x16\x07"}
    ds = load_dataset(_spec(_tarball(tmp_path / "d.tar", members), "image-tarball"))
    assert ds.y_train.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        pytest.param("image", "dataset.path: train/automobile/1.png is not an image that can be read", id="no image"),
        pytest.param("truncated", "cannot be read: ", id="a truncated archive"),
    ],
)
def test_a_broken_source_is_decoded_once_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str, says: str
) -> None:
    """Not taken for an unusable cache (which decoded it a second time, then showed a traceback)."""
    members = {
        f"{s}/{c}/{i}.png": _png(100 * k) for s in ("train", "test") for k, c in enumerate(CLASSES) for i in (0, 1)
    }
    if broken == "image":
        members["train/automobile/1.png"] = b"GIF89a but not really"
    path = _tarball(tmp_path / "d.tar", members)
    if broken == "truncated":
        gz = tmp_path / "d.tar.gz"
        gz.write_bytes(gzip.compress(path.read_bytes())[:-200])
        path = gz
    decodes: list[Path] = []
    real = cifar_module.decode_image_archive

    def counted(source: Path) -> dict[str, np.ndarray]:
        decodes.append(source)
        return real(source)

    monkeypatch.setattr(cifar_module, "decode_image_archive", counted)
    with pytest.raises(ValueError, match=says):
        load_dataset(_spec(path, "image-tarball"))
    assert len(decodes) == 1


def test_a_replaced_tarball_of_the_same_size_and_mtime_is_decoded_again(tmp_path: Path) -> None:
    """A corrected archive copied over the old one with its mtime kept (``cp -p``, ``rsync -t``): tar pads to
    blocks, so the size is the same too; the old cache's labels must not be served."""
    path = tmp_path / "d.tar"
    images = {"train/airplane/0.png": _png(10), "train/automobile/0.png": _png(200)}
    tests = {"test/airplane/0.png": _png(10), "test/automobile/0.png": _png(200)}
    _tarball(path, images | tests)
    first = load_dataset(_spec(path, "image-tarball"))
    stat = path.stat()
    swapped = {"train/airplane/0.png": _png(200), "train/automobile/0.png": _png(10)}
    _tarball(tmp_path / "new.tar", swapped | tests).replace(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    second = load_dataset(_spec(path, "image-tarball"))
    assert first.x_train[:, 0, 0, 0].tolist() == [10, 200]
    assert second.x_train[:, 0, 0, 0].tolist() == [200, 10]
    assert second.ingest_seconds > 0  # decoded, not a cache hit


@pytest.mark.parametrize(
    ("arrays", "says"),
    [
        pytest.param({"y_train": np.array([1, 2, 1, 2])}, "labels 1, 2: a binary task reads -1/+1 or 0/1", id="1/2"),
        pytest.param({"y_train": np.array([1, -1])}, "x_train (4, 3) and y_train (2,)", id="fewer labels than rows"),
        pytest.param({"x_test": np.zeros((2, 5))}, "x_test has 5 features, x_train 3", id="other features"),
    ],
)
def test_an_npz_that_is_not_a_binary_task_is_refused(tmp_path: Path, arrays: dict[str, np.ndarray], says: str) -> None:
    good: dict[str, Any] = {
        "x_train": np.zeros((4, 3)),
        "y_train": np.array([0, 1, 0, 1]),
        "x_test": np.zeros((2, 3)),
        "y_test": np.array([0, 1]),
    }
    path = tmp_path / "d.npz"
    np.savez(path, **(good | arrays))
    with pytest.raises(ValueError, match=f"dataset.path: .*{re.escape(says)}"):
        load_npz(path)
    np.savez(path, **good)
    assert load_npz(path).y_train.tolist() == [-1.0, 1.0, -1.0, 1.0]


@pytest.mark.parametrize("fmt", ["cifar10-python", "image-tarball"])
def test_the_pickled_batches_tarball_is_named_as_such(tmp_path: Path, fmt: str) -> None:
    """CIFAR-10's python tarball given as a path: say what it is, not that it lacks train/ and test/ images."""
    path = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in ("cifar-10-batches-py/batches.meta", "cifar-10-batches-py/data_batch_1"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(ValueError, match=r"is the pickled batches' tarball .*extract it and give the folder"):
        load_dataset(_spec(path, fmt))
