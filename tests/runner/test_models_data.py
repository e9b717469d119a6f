"""Model shapes and parameter counts; the dataset loaders on tiny generated files."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from mlbench_api.task import DatasetSpec, ModelSpec, SyntheticData
from mlbench_runner.augment import crop_flip
from mlbench_runner.data import load_dataset
from mlbench_runner.data.tabular import parse_libsvm, synthetic_epsilon
from mlbench_runner.models import CifarResNet, build_model

from .helpers import write_cifar_python


@pytest.mark.parametrize(("depth", "params"), [(20, 269_722), (32, 464_154), (44, 658_586), (56, 853_018)])
def test_resnet_m1_parameter_counts(depth: int, params: int) -> None:
    # Option A adds no parameters: He et al.'s 0.27M/0.46M/0.66M/0.85M (the widely used reference counts).
    model = CifarResNet(depth, "m1")
    assert sum(p.numel() for p in model.parameters()) == params
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_resnet_m2_runs_and_has_projection() -> None:
    model = build_model(ModelSpec.model_validate({"name": "resnet", "version": "m2", "depth": 20}))
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert any(isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1) for m in model.modules())
    out = model(torch.zeros(2, 3, 32, 32))
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())  # no unused parameters (DDP-safe)


def test_bad_depth_names_field() -> None:
    with pytest.raises(ValueError, match=r"model\.depth"):
        CifarResNet(18, "m1")


def test_crop_flip_keeps_pixels() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).reshape(2, 3, 32, 32) + 1
    y = crop_flip(x, g)
    assert y.shape == x.shape
    for i in range(2):  # every output pixel is an input pixel of the same image or the zero pad
        vals = set(y[i].flatten().tolist()) - {0.0}
        assert vals <= set(x[i].flatten().tolist())
        assert len(vals) >= 24 * 24 * 3


def test_cifar_python_and_subset(tmp_path: Path) -> None:
    folder = write_cifar_python(tmp_path, n_train=100, n_test=20)
    ds = load_dataset(
        DatasetSpec.model_validate({"name": "c", "format": "cifar10-python", "path": str(folder), "trainSubset": 30})
    )
    assert ds.x_train.shape == (30, 3, 32, 32)
    assert ds.x_test.shape == (20, 3, 32, 32)
    assert ds.mean is not None
    assert len(ds.mean) == 3
    with pytest.raises(ValueError, match="trainSubset"):
        load_dataset(
            DatasetSpec.model_validate(
                {"name": "c", "format": "cifar10-python", "path": str(folder), "trainSubset": 10_000}
            )
        )


def test_jpeg_tarball_decoded_once_and_balanced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    tar_path = tmp_path / "tiny.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        for split, n in (("train", 3), ("test", 1)):
            for c, cls in enumerate(("airplane", "automobile", "bird")):
                for i in range(n):
                    buf = io.BytesIO()
                    Image.fromarray(np.full((32, 32, 3), 40 * c + i, dtype=np.uint8)).save(buf, "PNG")
                    info = tarfile.TarInfo(f"{split}/{cls}/{i:04d}.png")
                    info.size = len(buf.getvalue())
                    tar.addfile(info, io.BytesIO(buf.getvalue()))
    spec = DatasetSpec.model_validate({"name": "t", "format": "image-tarball", "path": str(tar_path), "trainSubset": 3})
    ds = load_dataset(spec)
    assert ds.y_train.tolist() == [0, 1, 2]  # round-robin order: a prefix has every class
    assert ds.x_test.shape == (3, 3, 32, 32)
    assert int(ds.x_train[1, 0, 0, 0]) == 40
    cached = list((tmp_path / "cache" / "datasets").glob("*/meta.json"))
    assert len(cached) == 1
    assert load_dataset(spec).x_train.shape == (3, 3, 32, 32)  # from the cache


def test_libsvm_parser(tmp_path: Path) -> None:
    f = tmp_path / "eps"
    f.write_text("1 1:0.5 3:-1\n-1 2:2\n\n+1 3:0.25\n")
    x, y = parse_libsvm(f)
    assert x.shape == (3, 3)
    assert y.tolist() == [1, -1, 1]
    assert x[0].tolist() == [0.5, 0, -1]
    assert x[1].tolist() == [0, 2, 0]
    (tmp_path / "eps.t").write_text("-1 1:1\n")
    ds = load_dataset(DatasetSpec.model_validate({"name": "e", "format": "libsvm", "path": str(f)}))
    assert ds.x_test.shape == (1, 3)
    bad = tmp_path / "bad"
    bad.write_text("1 a:b\n")
    with pytest.raises(ValueError, match="LIBSVM"):
        parse_libsvm(bad)


def test_synthetic_epsilon_shape() -> None:
    ds = synthetic_epsilon(SyntheticData(train_samples=300, test_samples=100, features=2000, seed=1))
    assert ds.x_train.shape == (300, 2000)
    assert ds.x_train.dtype == np.float32
    assert set(np.unique(ds.y_train).tolist()) == {-1.0, 1.0}
    assert np.allclose(np.linalg.norm(ds.x_train, axis=1), 1.0, atol=1e-5)
    again = synthetic_epsilon(SyntheticData(train_samples=300, test_samples=100, features=2000, seed=1))
    assert np.array_equal(ds.x_train, again.x_train)


def test_missing_path_names_field(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"dataset\.path"):
        load_dataset(DatasetSpec.model_validate({"name": "c", "format": "npz", "path": str(tmp_path / "nope.npz")}))
