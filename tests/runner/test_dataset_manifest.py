"""Fetched data's per-file manifest, end to end on small generated data in the real formats: the CIFAR-10 python
archive (``cifar-10-batches-py/`` pickled batches in a .tar.gz, unpacked with stripComponents 1) and a single
``.npz`` file, served over HTTP, fetched into the content-addressed store, then loaded, tampered with and refused
(issue 33, data integrity)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlbench_api.datasets import store_name
from mlbench_api.task import DatasetSpec
from mlbench_runner import manifest
from mlbench_runner.data.loader import load_dataset
from mlbench_runner.pod.fetch import FetchError, FetchRequest, fetch, marker_path

from .helpers import write_cifar_python
from .test_fetch import Server, serve, server, sha

MAGIC = b"not cifar at all"


#: test_fetch's served folder, under the name these tests use
http = server


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLBENCH_DATASET_VERIFY", raising=False)
    monkeypatch.delenv("MLBENCH_DATA_DIR", raising=False)


def cifar_python_archive(tmp_path: Path) -> bytes:
    """The real archive's layout: ``cifar-10-batches-py/{data_batch_1..5,test_batch}`` in a .tar.gz."""
    folder = write_cifar_python(tmp_path / "src", n_train=20, n_test=10)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    return buf.getvalue()


def npz_file(tmp_path: Path) -> bytes:
    rng = np.random.default_rng(0)
    out = tmp_path / "src.npz"
    x, y = rng.normal(size=(12, 4)).astype(np.float32), np.where(rng.random(12) > 0.5, 1.0, -1.0)
    np.savez(out, x_train=x, y_train=y, x_test=x[:4], y_test=y[:4])
    return out.read_bytes()


def fetched_cifar(http: Server, tmp_path: Path) -> tuple[DatasetSpec, Path]:
    """The CIFAR-10 python archive fetched into the store; the spec reads it where the workers would see it."""
    data = cifar_python_archive(tmp_path)
    url = serve(http, "cifar-10-python.tar.gz", data)
    dest = tmp_path / "volume" / store_name(sha(data), True, 1)
    assert fetch(FetchRequest(url=url, sha256=sha(data), dest=dest, unpack=True, strip_components=1))
    spec = DatasetSpec.model_validate(
        {
            "name": "cifar10",
            "format": "cifar10-python",
            "path": "/data/cifar10/cifar-10-batches-py",
            "source": {"url": url, "sha256": sha(data), "unpack": True, "stripComponents": 1},
        }
    ).model_copy(update={"path": str(dest)})  # the mount's place, here
    return spec, dest


def marker(dest: Path) -> dict[str, Any]:
    return dict(json.loads(marker_path(dest).read_text()))


def test_cifar_python_archive_gets_a_per_file_manifest_and_loads(http: Server, tmp_path: Path) -> None:
    spec, dest = fetched_cifar(http, tmp_path)
    files = marker(dest)["files"]
    names = ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]
    assert [f["path"] for f in files] == names
    for f in files:
        body = (dest / f["path"]).read_bytes()
        assert (f["size"], f["sha256"]) == (len(body), sha(body))
    assert load_dataset(spec).x_train.shape == (20, 3, 32, 32)


def test_npz_file_gets_a_one_entry_manifest_and_loads(http: Server, tmp_path: Path) -> None:
    data = npz_file(tmp_path)
    url = serve(http, "eps.npz", data)
    dest = tmp_path / "volume" / store_name(sha(data), False, 0)
    assert fetch(FetchRequest(url=url, sha256=sha(data), dest=dest))
    assert marker(dest)["files"] == [{"path": ".", "size": len(data), "sha256": sha(data)}]
    spec = DatasetSpec.model_validate(
        {"name": "e", "format": "npz", "path": "/data/e.npz", "source": {"url": url, "sha256": sha(data)}}
    ).model_copy(update={"path": str(dest)})
    assert load_dataset(spec).x_train.shape == (12, 4)
    dest.write_bytes(data + b"\0")  # a longer file behind the same marker
    with pytest.raises(ValueError, match=r"dataset\.source: .* bytes, the manifest says"):
        load_dataset(spec)


def test_cifar_python_batch_of_another_size_is_refused(http: Server, tmp_path: Path) -> None:
    spec, dest = fetched_cifar(http, tmp_path)
    (dest / "data_batch_1").write_bytes(MAGIC)
    with pytest.raises(ValueError, match=r"dataset\.source: .*data_batch_1: 16 bytes, the manifest says"):
        load_dataset(spec)


def test_cifar_python_batch_of_the_same_size_is_refused_with_sha256_verification(
    http: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sizes are checked always; a same-size substitution only by hashing (``MLBENCH_DATASET_VERIFY=sha256``)."""
    spec, dest = fetched_cifar(http, tmp_path)
    batch = dest / "test_batch"
    body = bytearray(batch.read_bytes())
    body[-10] ^= 0xFF  # inside the pickled array: still a loadable batch, other pixels
    batch.write_bytes(bytes(body))
    assert load_dataset(spec).x_test.shape == (10, 3, 32, 32)  # sizes alone cannot see it
    monkeypatch.setenv("MLBENCH_DATASET_VERIFY", "sha256")
    with pytest.raises(ValueError, match=r"test_batch: sha256 [0-9a-f]{64}, the manifest says"):
        load_dataset(spec)


@pytest.mark.parametrize(
    ("forge", "needle"),
    [
        (lambda m, d: marker_path(d).unlink(), "no readable fetch marker"),
        (lambda m, d: marker_path(d).write_text("{"), "no readable fetch marker"),
        (lambda m, d: marker_path(d).write_text(json.dumps({k: v for k, v in m.items() if k != "files"})), "manifest"),
        (lambda m, d: marker_path(d).write_text(json.dumps({**m, "files": []})), "no per-file manifest"),
        (lambda m, d: marker_path(d).write_text(json.dumps({**m, "sha256": "b" * 64})), "another source"),
        (lambda m, d: marker_path(d).write_text(json.dumps({**m, "stripComponents": 0})), "laid out"),
        (lambda m, d: (d / "data_batch_6").write_bytes(MAGIC), "the manifest does not list"),
        (lambda m, d: (d / "data_batch_2").unlink(), "data_batch_2: missing"),
        (
            lambda m, d: marker_path(d).write_text(
                json.dumps({**m, "files": [{"path": "../../etc/passwd", "size": 1}]})
            ),
            "outside the data",
        ),
    ],
    ids=[
        "missing",
        "unreadable",
        "no-manifest",
        "empty-manifest",
        "other-sha",
        "other-layout",
        "extra",
        "gone",
        "escape",
    ],
)
def test_cifar_python_with_a_missing_or_forged_marker_is_refused(
    http: Server, tmp_path: Path, forge: Any, needle: str
) -> None:
    spec, dest = fetched_cifar(http, tmp_path)
    forge(marker(dest), dest)
    with pytest.raises(ValueError, match=r"dataset\.source") as info:
        load_dataset(spec)
    assert needle in str(info.value)


def test_a_local_copy_without_a_marker_is_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found through ``$MLBENCH_DATA_DIR`` (a local run's copy), a sourced dataset needs no marker."""
    write_cifar_python(tmp_path / "local", n_train=20, n_test=10)
    monkeypatch.setenv("MLBENCH_DATA_DIR", str(tmp_path / "local"))
    spec = DatasetSpec.model_validate(
        {
            "name": "cifar10",
            "format": "cifar10-python",
            "path": "/data/nowhere/cifar-10-batches-py",
            "source": {"url": "https://example.org/c.tgz", "sha256": "a" * 64, "unpack": True, "stripComponents": 1},
        }
    )
    assert load_dataset(spec).x_train.shape == (20, 3, 32, 32)


def test_the_fetcher_does_not_trust_a_marker_whose_files_changed(http: Server, tmp_path: Path) -> None:
    spec, dest = fetched_cifar(http, tmp_path)
    gets = http.gets
    req = FetchRequest(url=spec.source.url, sha256=spec.source.sha256, dest=dest, unpack=True, strip_components=1)  # type: ignore[union-attr]
    assert not fetch(req)  # untouched: a no-op
    (dest / "data_batch_3").write_bytes(MAGIC)
    assert fetch(req)  # fetched again, not "already there"
    assert http.gets == gets + 1
    manifest.check(dest, marker(dest))
    assert load_dataset(spec).x_train.shape == (20, 3, 32, 32)


@pytest.mark.parametrize("name", [f"sha256-{'0' * 64}", f"sha256-{'0' * 64}-x1"])
def test_the_fetcher_fills_a_store_entry_only_with_the_data_its_name_says(
    http: Server, tmp_path: Path, name: str
) -> None:
    data = npz_file(tmp_path)
    url = serve(http, "eps.npz", data)
    dest = tmp_path / "volume" / name
    with pytest.raises(FetchError, match=r"is a store entry of other data \(this is sha256-"):
        fetch(FetchRequest(url=url, sha256=sha(data), dest=dest))
    assert http.gets == 0
    assert not dest.exists()
