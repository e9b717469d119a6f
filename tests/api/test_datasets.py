"""Dataset sources in the API: the path rule, overrides (mirrors in the closed division), the fetch contract."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from mlbench_api.catalog import load_catalog
from mlbench_api.common import ObjectMeta
from mlbench_api.config import OverrideNotAllowed, apply_overrides
from mlbench_api.datasets import EXIT_FOR_REASON, FetchFailure, FetchReason, redact_url, redact_urls
from mlbench_api.dataspec import DatasetSpec, path_under_data_root
from mlbench_api.errors import format_errors
from mlbench_api.run import BenchmarkRun, BenchmarkRunSpec
from mlbench_api.task import BenchmarkTaskSpec, Division

SHA = "0493b9c94c62a5e8a6b98a28016b4eebed4fa9aac8154143eead5d26fc94fabb"
CIFAR_SHA = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"


def run_with(overrides: dict[str, Any], task: str) -> BenchmarkRun:
    spec = BenchmarkRunSpec.model_validate({"taskRef": {"name": task}, "workers": 2, "overrides": overrides})
    return BenchmarkRun(metadata=ObjectMeta(name="r", namespace="ns"), spec=spec)


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/data/cifar10", True),
        ("/data/a/b.tar.gz", True),
        ("/data/..hidden", True),
        ("/data", False),
        ("/data/", False),
        ("/database/x", False),
        ("/data/../etc", False),
        ("/data/./x", False),
        ("/data/x/..", False),
        ("data/x", False),
        (None, False),
    ],
)
def test_path_under_data_root(path: str | None, ok: bool) -> None:
    assert path_under_data_root(path) is ok


def test_a_sourced_dataset_names_its_rules() -> None:
    with pytest.raises(ValidationError) as info:
        DatasetSpec.model_validate(
            {"name": "d", "format": "npz", "path": "/srv/x.npz", "source": {"url": "https://e.x/x.npz", "sha256": SHA}}
        )
    assert format_errors(info.value) == ["path: with a source, path must lie under /data/ (no '.' or '..' segments)"]


def test_the_catalog_fetches_cifar10_with_the_published_checksum() -> None:
    tasks = load_catalog()
    cifar = tasks["cifar10-resnet20"].spec.dataset
    assert cifar.source is not None
    assert cifar.source.url == "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert cifar.source.sha256 == CIFAR_SHA
    assert (cifar.source.unpack, cifar.source.strip_components) == (True, 1)
    assert cifar.path == "/data/cifar10/cifar-10-batches-py"  # what the cifar10-python loader reads
    smoke = tasks["cifar10-resnet20-smoke"].spec.dataset
    assert smoke.source is not None
    assert smoke.source.sha256 == SHA
    assert tasks["epsilon-logreg"].spec.dataset.source is None  # no checksum to pin: a user-provided volume


def test_a_closed_run_may_use_a_mirror_of_the_same_bytes() -> None:
    task = load_catalog()["cifar10-resnet20"].spec
    mirror = {
        "url": "http://mirror.datasets.svc/cifar-10-python.tar.gz",
        "sha256": CIFAR_SHA,
        "unpack": True,
        "stripComponents": 1,
    }
    effective = apply_overrides(task, run_with({"datasetSource": mirror}, "cifar10-resnet20"))
    assert effective.dataset.source is not None
    assert effective.dataset.source.url == mirror["url"]


def test_a_closed_run_may_not_swap_the_data() -> None:
    task = load_catalog()["cifar10-resnet20"].spec
    other = {"url": "http://mirror.datasets.svc/other.tar.gz", "sha256": SHA}
    with pytest.raises(OverrideNotAllowed, match=r"spec\.overrides\.datasetSource\.sha256: .*got " + SHA):
        apply_overrides(task, run_with({"datasetSource": other}, "cifar10-resnet20"))


def test_an_open_run_points_the_smoke_task_at_its_own_server() -> None:
    task = load_catalog()["cifar10-resnet20-smoke"].spec
    url = "http://datasets.e2e.svc:8080/cifar10-jpeg.tar.gz"
    effective = apply_overrides(task, run_with({"datasetSource": {"url": url, "sha256": SHA}}, "x"))
    assert effective.dataset.source is not None
    assert effective.dataset.source.url == url
    assert effective.dataset.path == "/data/cifar10/cifar10-jpeg.tar.gz"


def test_a_source_override_replaces_a_volume() -> None:
    task = load_catalog()["epsilon-logreg"].spec
    spec = task.to_api()
    spec["dataset"]["volume"] = {"persistentVolumeClaim": {"claimName": "mine"}}
    spec["overridable"] = ["datasetSource"]
    effective = apply_overrides(
        BenchmarkTaskSpec.model_validate(spec),
        run_with({"datasetSource": {"url": "https://e.x/eps.tar", "sha256": SHA, "unpack": True}}, "epsilon-logreg"),
    )
    assert effective.dataset.volume is None
    assert effective.dataset.source is not None


def test_fetch_failure_round_trips_and_ignores_foreign_text() -> None:
    failure = FetchFailure(FetchReason.VOLUME_FULL, "no space left on volume mlbench-datasets")
    assert FetchFailure.parse(failure.termination_message()) == failure
    assert FetchFailure.parse("Traceback (most recent call last): ...") is None
    assert FetchFailure.parse('{"reason": "Bogus", "message": "x"}') is None
    assert FetchFailure.parse(None) is None
    assert len(FetchFailure(FetchReason.FETCH_FAILED, "x" * 10_000).termination_message()) < 4096
    assert set(EXIT_FOR_REASON) == set(FetchReason)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://mirror.example.com/cifar/c.tgz", "https://mirror.example.com/cifar/c.tgz"),
        ("https://user:hunter2@mirror.example.com:8443/c.tgz", "https://mirror.example.com:8443/c.tgz"),
        (
            "https://b.s3.amazonaws.com/c.tgz?X-Amz-Signature=abc&X-Amz-Credential=k",
            "https://b.s3.amazonaws.com/c.tgz?…",
        ),
        ("http://h/c.tgz#token=abc", "http://h/c.tgz?…"),
        ("http://tok@[fd00::1]:80/c", "http://[fd00::1]:80/c"),
        ("http://h:99999/c?k=v", "http://…"),  # unparseable port: the scheme only
    ],
)
def test_a_url_is_said_without_userinfo_query_or_fragment(url: str, said: str) -> None:
    assert redact_url(url) == said


def test_every_url_in_a_message_is_redacted_and_its_punctuation_kept() -> None:
    text = "GET https://u:pw@h/x?sig=1: HTTP 403 Forbidden; redirected to ftp://a:b@evil/y?z, see (http://h/z)."
    assert redact_urls(text) == "GET https://h/x?…: HTTP 403 Forbidden; redirected to ftp://evil/y?…, see (http://h/z)."


def test_a_failure_message_never_carries_a_secret_either_way() -> None:
    """Written by the fetcher and read by the operator (an older fetcher's unredacted words too)."""
    secret = "GET https://user:hunter2@h/c.tgz?token=s3cr3t: HTTP 404 Not Found"
    written = FetchFailure(FetchReason.SOURCE_UNREACHABLE, secret).termination_message()
    assert "hunter2" not in written
    assert "s3cr3t" not in written
    unredacted = json.dumps({"reason": "SourceUnreachable", "message": secret})
    read = FetchFailure.parse(unredacted)
    assert read is not None
    assert read.message == "GET https://h/c.tgz?…: HTTP 404 Not Found"


@pytest.mark.parametrize(
    ("path", "word"),
    [
        (f"/data/sha256-{SHA}", "store"),
        (f"/data/sha256-{SHA}-x1/data_batch_1", "store"),
        ("/data/cifar10.mlbench-dataset.json", "marker"),
        ("/data/cifar10.mlbench-dataset.json/x", "marker"),
    ],
)
def test_a_sourced_path_may_not_name_the_store_or_a_marker(path: str, word: str) -> None:
    with pytest.raises(ValidationError) as info:
        DatasetSpec.model_validate(
            {"name": "d", "format": "npz", "path": path, "source": {"url": "https://e.x/x.npz", "sha256": SHA}}
        )
    (error,) = format_errors(info.value)
    assert error.startswith(f"path: {path} names ")
    assert word in error


def test_an_open_override_naming_the_store_is_refused_naming_the_run_field() -> None:
    tasks = load_catalog()
    task = tasks["cifar10-resnet20"].spec.model_copy(update={"division": Division.OPEN})
    with pytest.raises(ValueError, match=r"^spec\.overrides\.dataset: /data/sha256-.* names the dataset store"):
        apply_overrides(task, run_with({"dataset": f"/data/sha256-{CIFAR_SHA}-x1"}, "cifar10-resnet20"))
    with pytest.raises(ValueError, match=r"^spec\.overrides\.dataset: .* names a dataset marker"):
        apply_overrides(task, run_with({"dataset": "/data/cifar10/cifar-10-batches-py.mlbench-dataset.json"}, "x"))
    plain = apply_overrides(task, run_with({"dataset": "/data/mine"}, "cifar10-resnet20"))
    assert plain.dataset.path == "/data/mine"
