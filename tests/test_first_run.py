"""A cluster's first run works on public data: the README's first cluster example is the public smoke task on
2 workers at 1 CPU, whose data is CIFAR-10's public python archive with task 1a's checksum (nothing is downloaded
here: the archive's identity is compared with task 1a's, which tests/api/test_catalog.py pins)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from mlbench_api.catalog import load_catalog
from mlbench_api.task import Division

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "manifests" / "examples" / "cifar10-smoke-2workers.yaml"
TASK = "cifar10-resnet20-public-smoke"
PUBLIC_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"


def test_the_public_smoke_task_fetches_task_1a_s_public_archive() -> None:
    catalog = load_catalog()
    smoke, official = catalog[TASK].spec, catalog["cifar10-resnet20"].spec
    assert smoke.division is Division.OPEN
    assert smoke.dataset.source is not None
    assert official.dataset.source is not None
    assert str(smoke.dataset.source.url) == PUBLIC_URL
    # the same file at the same path: one fetch per namespace serves both tasks
    assert smoke.dataset.source == official.dataset.source
    assert (smoke.dataset.path, smoke.dataset.format) == (official.dataset.path, official.dataset.format)
    assert smoke.dataset.train_subset is not None
    assert smoke.dataset.train_subset <= 5000
    assert smoke.training.max_epochs <= 10


def test_the_example_runs_it_on_two_workers_at_one_cpu() -> None:
    (run,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    spec = run["spec"]
    assert spec["taskRef"]["name"] == TASK
    assert (spec["workers"], spec.get("slotsPerWorker", 1), spec["resources"]["cpu"]) == (2, 1, "1")


def test_the_readmes_first_cluster_example_is_the_public_smoke_run() -> None:
    readme = (REPO / "README.md").read_text()
    cluster = readme[readme.index("### On a cluster") :]
    applied = re.findall(r"kubectl apply -f (manifests/examples/\S+\.yaml)", cluster)
    assert applied, "no example applied in the README's cluster section"
    assert applied[0] == EXAMPLE.relative_to(REPO).as_posix()
    assert f"mlbench results default/{run_name()}" in cluster


def run_name() -> str:
    (run,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    name: str = run["metadata"]["name"]
    return name
