"""The README e2e's archive (tests/e2e/cifar_python.py) is what the runner reads as CIFAR-10's python format: the
runner's own loader (restricted unpickler included) gives back the JPEG copy's pixels and labels, class by class."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mlbench_runner.data.cifar import load_cifar_python
from tests.e2e.cifar_python import CLASSES, TOP, write_archive


def jpeg_tarball(path: Path, per_class: dict[str, int]) -> dict[tuple[str, str, int], np.ndarray]:
    """A ``train|test/<class>/<n>.jpg`` tarball of random images; their pixels as PIL decodes them (HWC)."""
    rng = np.random.default_rng(0)
    decoded = {}
    with tarfile.open(path, "w:gz") as tar:
        for split, count in per_class.items():
            for cls in CLASSES:
                for i in range(count):
                    buf = io.BytesIO()
                    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
                    data = buf.getvalue()
                    with Image.open(io.BytesIO(data)) as img:
                        decoded[split, cls, i] = np.asarray(img.convert("RGB"))
                    info = tarfile.TarInfo(f"{split}/{cls}/{i:04d}.jpg")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return decoded


def test_the_runner_reads_it_as_cifar10_python(tmp_path: Path) -> None:
    decoded = jpeg_tarball(tmp_path / "jpeg.tar.gz", {"train": 6, "test": 3})
    out = write_archive(tmp_path / "jpeg.tar.gz", tmp_path / "cifar-10-python.tar.gz", 5, 2)
    with tarfile.open(out) as tar:
        names = sorted(tar.getnames())
        tar.extractall(tmp_path / "x", filter="data")
    assert names == sorted(
        f"{TOP}/{n}" for n in ("batches.meta", "test_batch", *(f"data_batch_{i}" for i in range(1, 6)))
    )
    ds = load_cifar_python(tmp_path / "x" / TOP)
    assert ds.x_train.shape == (50, 3, 32, 32)
    assert ds.x_test.shape == (20, 3, 32, 32)
    assert list(ds.y_train[:20]) == list(range(10)) * 2  # classes in turn: a prefix is class-balanced
    assert list(ds.y_test) == list(range(10)) * 2
    # the 13th training image is the second image of class 2; the last test image the second of class 9
    assert np.array_equal(ds.x_train[12], decoded["train", CLASSES[2], 1].transpose(2, 0, 1))
    assert np.array_equal(ds.x_test[19], decoded["test", CLASSES[9], 1].transpose(2, 0, 1))


def test_too_few_images_are_named(tmp_path: Path) -> None:
    jpeg_tarball(tmp_path / "jpeg.tar.gz", {"train": 5, "test": 1})
    with pytest.raises(ValueError, match=r"too few test images .*want 2 of each"):
        write_archive(tmp_path / "jpeg.tar.gz", tmp_path / "out.tar.gz", 5, 2)
