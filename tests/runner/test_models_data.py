"""Model shapes and parameter counts; the dataset loaders on tiny generated files."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mlbench_api.dataspec import DatasetSpec, SyntheticData
from mlbench_api.model import ModelSpec
from mlbench_runner import manifest
from mlbench_runner.data import load_dataset
from mlbench_runner.data.tabular import parse_libsvm, synthetic_epsilon
from mlbench_runner.rank.augment import crop_flip
from mlbench_runner.rank.models import CifarResNet, build_model

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


def test_libsvm_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
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


@pytest.mark.parametrize(
    ("marker", "refused"),
    [
        ({"sha256": "a" * 64, "unpack": True, "stripComponents": 0}, None),  # this task's fetch
        ({"sha256": "b" * 64, "unpack": True, "stripComponents": 0}, r"another source \(sha256 b{64}\)"),
        (None, "no readable fetch marker"),  # at the declared path (the operator's mount) a marker is required
    ],
)
def test_a_sourced_dataset_is_the_source_the_marker_says(
    tmp_path: Path, marker: dict[str, Any] | None, refused: str | None
) -> None:
    folder = write_cifar_python(tmp_path / "data", n_train=20, n_test=10)
    spec = DatasetSpec.model_validate(
        {
            "name": "c",
            "format": "cifar10-python",
            "path": "/data/cifar10",
            "source": {"url": "https://example.org/c.tgz", "sha256": "a" * 64, "unpack": True},
        }
    ).model_copy(update={"path": str(folder)})  # the volume's path, here
    if marker is not None:
        record = {**marker, "files": manifest.build(folder)}
        folder.with_name(folder.name + ".mlbench-dataset.json").write_text(json.dumps(record))
    if refused:
        with pytest.raises(ValueError, match=r"dataset\.source(\.sha256)?: .*" + refused):
            load_dataset(spec)
    else:
        assert load_dataset(spec).x_train.shape == (20, 3, 32, 32)


def test_missing_path_names_field(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"dataset\.path"):
        load_dataset(DatasetSpec.model_validate({"name": "c", "format": "npz", "path": str(tmp_path / "nope.npz")}))


def _slow_reference(text: str, width: int) -> tuple[np.ndarray, np.ndarray]:
    rows = [line.split() for line in text.splitlines() if line.strip()]
    x = np.zeros((len(rows), width), dtype=np.float32)
    for r, parts in enumerate(rows):
        for tok in parts[1:]:
            i, v = tok.split(":")
            x[r, int(i) - 1] = np.float32(float(v))
    return x, np.asarray([1.0 if float(p[0]) > 0 else -1.0 for p in rows], dtype=np.float32)


def test_libsvm_vectorised_dense_sparse_bz2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bz2

    from mlbench_runner.data import tabular

    rng = np.random.default_rng(0)
    dense = "".join(
        f"{rng.choice(['+1', '-1'])} "
        + " ".join(f"{i}:{v:.6g}" for i, v in enumerate(rng.standard_normal(7), 1))
        + "\n"
        for _ in range(50)
    )
    sparse = "1 2:0.5 7:-1e-3\n-1\n+1 1:3 5:2.5\n\n-1 7:1\n"
    text = dense + sparse + dense[:200].rsplit("\n", 1)[0] + "\n"  # dense, then sparse, then dense again
    f = tmp_path / "mixed"
    f.write_text(text)
    monkeypatch.setattr(tabular, "CHUNK_BYTES", 512)  # many blocks: dense ones in one call, sparse per line
    x, y = tabular.parse_libsvm(f)
    ref_x, ref_y = _slow_reference(text, 7)
    np.testing.assert_array_equal(x, ref_x)
    np.testing.assert_array_equal(y, ref_y)
    (tmp_path / "mixed.bz2").write_bytes(bz2.compress(text.encode()))
    xb, yb = tabular.parse_libsvm(tmp_path / "mixed.bz2", features=9)
    np.testing.assert_array_equal(xb[:, :7], ref_x)
    assert not xb[:, 7:].any()
    np.testing.assert_array_equal(yb, ref_y)

    # A fully dense file never goes through the per-token parser.
    def per_token(*args: object) -> None:
        raise AssertionError("per-token parse of a dense line")

    monkeypatch.setattr(tabular, "_parse_line", per_token)
    (tmp_path / "dense").write_text(dense)
    np.testing.assert_array_equal(tabular.parse_libsvm(tmp_path / "dense")[0], _slow_reference(dense, 7)[0])


@pytest.mark.parametrize(
    ("text", "x", "y"),
    [
        ("1 1:0.5 2:0.25 3:1\n-1 2:0.75\n", [[0.5, 0.25, 1], [0, 0.75, 0]], [1, -1]),  # totals fit a 2-wide table
        ("1 1:1 2:2\n1 1:0.5 2:0.25 3:1\n-1 2:0.75\n", [[1, 2, 0], [0.5, 0.25, 1], [0, 0.75, 0]], [1, 1, -1]),
        ("-1 2:0.75\n1 1:0.5 2:0.25 3:1\n", [[0, 0.75, 0], [0.5, 0.25, 1]], [-1, 1]),
        ("1 1:0.5 2:0.25\n\n-1 1:1 2:2\n", [[0.5, 0.25], [1, 2]], [1, -1]),  # a blank line: still dense
        ("\n1 1:0.5\n\n\n-1 1:2\n", [[0.5], [2]], [1, -1]),
        ("1 1:0.5 2:0.25\n-1\n", [[0.5, 0.25], [0, 0]], [1, -1]),
    ],
)
def test_libsvm_rows_of_any_length_keep_their_columns(
    tmp_path: Path, text: str, x: list[list[float]], y: list[float]
) -> None:
    """The one-table fast path must not shift a short row's numbers into another row's columns."""
    f = tmp_path / "eps"
    f.write_text(text)
    got_x, got_y = parse_libsvm(f)
    assert got_x.tolist() == x
    assert got_y.tolist() == y


@pytest.mark.parametrize(
    ("text", "rows"),
    [
        (b"1 1:0.5 2:0.25\n-1 1:1 2:2\n", 2),
        (b"1 1:0.5 2:0.25\n\n\n-1 1:1 2:2\n", 2),
        (b"1\n-1\n", 2),
        (b"1 1:0.5 2:0.25 3:1\n-1 2:0.75\n", None),  # 3 and 1 features: line by line
        (b"1 1:1 2:2\n1 1:0.5 2:0.25 3:1\n-1 2:0.75\n", None),
        (b"1 1:0.5 2:0.25\n  \n", None),  # a line of spaces: the line parser skips it
        (b"1 1:0.5\n-1 1:1", None),  # no final newline
        (b"", None),
    ],
)
def test_dense_block_takes_only_equal_rows(text: bytes, rows: int | None) -> None:
    from mlbench_runner.data import tabular

    dense = tabular._dense_block(text)
    assert (None if dense is None else len(dense[0])) == rows


def test_libsvm_cached_as_npy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlbench_runner.data import tabular

    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "eps").write_text("1 1:0.5 2:1\n-1 1:2 2:0\n")
    (tmp_path / "eps.t").write_text("-1 2:1\n")
    spec = DatasetSpec.model_validate({"name": "e", "format": "libsvm", "path": str(tmp_path / "eps")})
    first = load_dataset(spec)
    assert first.ingest_seconds > 0
    assert len(list((tmp_path / "cache" / "datasets").glob("libsvm-*/x_train.npy"))) == 1

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed again despite the cache")

    monkeypatch.setattr(tabular, "parse_libsvm", no_parse)
    again = load_dataset(spec)
    assert again.ingest_seconds == 0
    np.testing.assert_array_equal(again.x_train, first.x_train)
    np.testing.assert_array_equal(again.x_test, [[0, 1]])


@pytest.mark.parametrize(
    ("splits", "train", "test"),
    [
        (("train", "test"), [0, 1], [0, 1]),
        (("Train", "test"), [0, 1], [0, 1]),
        (("TRAIN", "Test"), [0, 1], [0, 1]),
        (("train", "Train", "test"), [0, 1, 0, 1], [0, 1]),  # one split in two spellings, same file names
    ],
)
def test_image_folder_split_names_ignore_case(
    tmp_path: Path, splits: tuple[str, ...], train: list[int], test: list[int]
) -> None:
    """The image pattern matches Train/ as train/, so the split must be read the same way (not a KeyError)."""
    from PIL import Image

    from mlbench_runner.data.cifar import decode_image_archive

    for split in splits:
        for c, cls in enumerate(("airplane", "automobile")):
            (tmp_path / split / cls).mkdir(parents=True)
            Image.fromarray(np.full((32, 32, 3), 50 * c, dtype=np.uint8)).save(tmp_path / split / cls / "0.png")
    out = decode_image_archive(tmp_path)
    assert out["y_train"].tolist() == train
    assert out["y_test"].tolist() == test
    assert out["classes"].tolist() == ["airplane", "automobile"]


def test_unusable_cache_falls_back_to_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # mkdir under a file fails even as root (like a root-owned cache for UID 1000)
    monkeypatch.setenv("MLBENCH_CACHE", str(blocker))
    folder = tmp_path / "imgs"
    for split in ("train", "test"):
        for c, cls in enumerate(("airplane", "automobile")):
            (folder / split / cls).mkdir(parents=True)
            Image.fromarray(np.full((32, 32, 3), 50 * c, dtype=np.uint8)).save(folder / split / cls / "0.png")
    ds = load_dataset(DatasetSpec.model_validate({"name": "t", "format": "image-folder", "path": str(folder)}))
    assert ds.y_train.tolist() == [0, 1]
    assert int(ds.x_train[1, 0, 0, 0]) == 50
    (tmp_path / "eps").write_text("1 1:0.5\n")
    (tmp_path / "eps.t").write_text("-1 1:1\n")
    eps = load_dataset(DatasetSpec.model_validate({"name": "e", "format": "libsvm", "path": str(tmp_path / "eps")}))
    assert eps.x_train.tolist() == [[0.5]]


def test_runner_image_cache_writable_by_pod_user() -> None:
    """Pods run as UID 1000; the image's MLBENCH_CACHE must not stay root-owned."""
    from .helpers import REPO

    text = (REPO / "Dockerfile.runner").read_text()
    assert "MLBENCH_CACHE=/var/cache/mlbench" in text
    assert "chown 1000:1000 /var/cache/mlbench" in text


@pytest.mark.multiproc
def test_one_time_ingest_left_out_of_wall_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding into the cache is one-time reformatting: not in wallClockSeconds (docs/runner.md)."""
    import time

    from mlbench_runner.data import tabular
    from mlbench_runner.options import Options
    from mlbench_runner.rank.train import train
    from mlbench_runner.world import World

    from .helpers import logreg_task, make_config

    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(1)
    for name, n in (("eps", 40), ("eps.t", 20)):
        rows = rng.standard_normal((n, 4))
        (tmp_path / name).write_text(
            "".join(
                f"{1 if r[0] > 0 else -1} " + " ".join(f"{i}:{v:.4f}" for i, v in enumerate(r, 1)) + "\n" for r in rows
            )
        )
    real = tabular.parse_libsvm

    def slow_parse(*args: object, **kwargs: object) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(1.0)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tabular, "parse_libsvm", slow_parse)
    task = logreg_task(batch=10, epochs=1, target=0.01)
    task["dataset"] = {"name": "eps-file", "format": "libsvm", "path": str(tmp_path / "eps")}
    config = make_config(task, tmp_path / "out", 1)
    (tmp_path / "out").mkdir()
    start = time.perf_counter()
    summary = train(config, World(0, 1, 0, 1, "127.0.0.1", 0, "single"), Options())
    total = time.perf_counter() - start
    assert summary is not None
    assert summary.steps == 4
    assert summary.wall_clock_seconds < total - 1.5  # the 2 s of (slow) decoding is not in it
    assert summary.time_to_goal_seconds is not None
    assert summary.time_to_goal_seconds < total - 1.5


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("1 1:2:2 3\n", 1, "'1:2:2' is not index:value"),  # dense-looking: 2 colons, 3 tokens, 5 numbers
        ("1:1 2:2 5\n", 1, "label '1:1' is not a number"),  # a colon in the label
        ("1 1:2:2 3\n-1 1:1\n", 1, "'1:2:2'"),  # rows of different widths: the line-by-line path
        ("1 1:1 2:2 3:3\n1:1 2:2 5\n", 2, "label '1:1'"),
        ("1 1:1 2:2\n-1 1:1 2:2 3\n", 2, "'3' is not index:value"),
        ("1 1: 2 2:3\n", 1, "'2' is not index:value"),  # an empty value, then a bare number: the counts fit
        ("1 1 :2 2:3\n", 1, "'1' is not index:value"),
        ("1 1:0.5 2:3\n-1 1 : 2 2:3\n", 2, "'1' is not index:value"),
    ],
)
def test_libsvm_refuses_tokens_the_number_counts_would_accept(tmp_path: Path, text: str, line: int, says: str) -> None:
    """Colons read as spaces make ``1 1:2:2 3`` count like ``1 1:2 2:3``: the token check must refuse it."""
    f = tmp_path / "eps"
    f.write_text(text)
    with pytest.raises(ValueError, match=rf"dataset\.path: .*eps:{line} is not LIBSVM .*{re.escape(says)}"):
        parse_libsvm(f)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (b"1 1:0.5 2:0.25\n-1 1:1 2:2\n", True),
        (b"1\n\n  \n-1 3:1\r\n", True),
        (b"", True),
        (b"  1 1:2\t2:3 \n", True),  # leading, trailing and tab separators
        (b"1 1:2:2 3\n", False),
        (b" 1:1 2:2\n", False),  # a label after leading spaces
        (b"1 1: 2 2:3\n", False),  # a token without a colon
        (b"1 1:2\n-1 3\n", False),
        (b"1:1 2:2 5\n", False),
        (b"1 1:2\n-1:3 2:1\n", False),  # the second line's label
        (b"1 1:2 2:3\n\n2:1\n", False),  # after an empty line
    ],
)
def test_tokens_well_formed(text: bytes, ok: bool) -> None:
    from mlbench_runner.data import tabular

    assert tabular._tokens_well_formed(text) is ok


# -- memory and cache keys of the data path ------------------------------------------------------------------


def test_dense_block_labels_do_not_hold_the_number_table() -> None:
    """A view of the labels kept the block's whole float64 table alive until the file was parsed (for epsilon,
    13 GB beside the 3.2 GB of float32 features)."""
    from mlbench_runner.data import tabular

    dense = tabular._dense_block(b"1 1:0.5 2:0.25\n-1 1:1 2:2\n")
    assert dense is not None
    assert dense[0].base is None
    assert dense[0].tolist() == [1.0, -1.0]


def _peak_bytes(fn: Any) -> int:
    """The peak of traced allocations (numpy's included) while ``fn`` runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_channel_stats_match_numpy_without_a_float64_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlbench_runner.data import cifar

    x = np.random.default_rng(0).integers(0, 256, size=(2000, 3, 32, 32), dtype=np.uint8)
    flat = x.transpose(1, 0, 2, 3).reshape(3, -1)
    mean, std = cifar.channel_stats(x)
    np.testing.assert_allclose(mean, flat.mean(axis=1, dtype=np.float64), rtol=1e-12)
    np.testing.assert_allclose(std, flat.std(axis=1, dtype=np.float64), rtol=1e-12)
    monkeypatch.setattr(cifar, "STATS_CHUNK", 128)
    assert _peak_bytes(lambda: cifar.channel_stats(x)) < 2 * x.nbytes  # the whole-array way: about 9x


def test_a_saved_cache_is_read_back_not_held_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoding rank held the decoded arrays while it read the saved copy back (8 GB for epsilon, not 4)."""
    from mlbench_runner.data.base import cached_arrays

    size = 8 << 20

    def decode() -> dict[str, Any]:
        return {"arrays": {"x": np.ones(size // 4, dtype=np.float32)}}

    out: dict[str, Any] = {}
    peak = _peak_bytes(lambda: out.update(cached_arrays(tmp_path / "c", tmp_path, ["x"], decode, mmap=False)))
    assert out["arrays"]["x"].nbytes == size
    assert peak < 1.5 * size


def test_an_image_folder_cache_follows_its_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image replaced or added below train/<class>/ leaves the folder's own mtime alone: the cache must
    still see it (it kept serving the old images); two folders of one name do not share a cache."""
    from PIL import Image

    from mlbench_runner.data import cifar

    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "a" / "imgs"
    for split in ("train", "test"):
        for c, cls in enumerate(("airplane", "automobile")):
            (folder / split / cls).mkdir(parents=True)
            Image.fromarray(np.full((32, 32, 3), 50 * c, dtype=np.uint8)).save(folder / split / cls / "0.png")
    top = folder.stat().st_mtime_ns
    first = cifar.load_image_archive(folder)
    Image.fromarray(np.full((32, 32, 3), 200, dtype=np.uint8)).save(folder / "train" / "airplane" / "1.png")
    os.utime(folder, ns=(top, top))  # as if nothing had changed at the top
    second = cifar.load_image_archive(folder)
    assert (len(first.y_train), len(second.y_train)) == (2, 3)
    other = tmp_path / "b" / "imgs"
    shutil.copytree(folder, other)
    assert cifar._cache_dir(other) != cifar._cache_dir(folder)
    # replaced with the same size and its old mtime restored (as tar and cp -p do): the change time says so
    image = folder / "train" / "automobile" / "0.png"
    before, stat = cifar._cache_dir(folder), image.stat()
    time.sleep(0.01)
    image.write_bytes(image.read_bytes()[::-1])
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cifar._cache_dir(folder) != before
    after = cifar._cache_dir(folder)
    (folder / "train" / "README.txt").write_text("not an image")  # what the loader does not read: no new key
    assert cifar._cache_dir(folder) == after


@pytest.mark.parametrize(
    ("labels", "refused"),
    [("1 -1", None), ("+1 -1", None), ("1 0", None), ("1 1", None), ("1 2", "labels 1, 2"), ("3 -1", "labels -1, 3")],
)
def test_libsvm_labels_are_binary(tmp_path: Path, labels: str, refused: str | None) -> None:
    """Anything but -1/+1 or 0/1 is refused by name: {1, 2} became all +1, one class, silently."""
    first, second = labels.split()
    (tmp_path / "f").write_text(f"{first} 1:0.5\n{second} 1:1\n")
    if refused is None:
        assert sorted(parse_libsvm(tmp_path / "f")[1].tolist()) == sorted(
            [1.0 if float(v) > 0 else -1.0 for v in (first, second)]
        )
    else:
        with pytest.raises(ValueError, match=f"dataset.path: .*: {refused}: a binary task reads -1/\\+1 or 0/1"):
            parse_libsvm(tmp_path / "f")
