"""Every example under manifests/examples is what a user may apply as it is: ``mlbench validate`` accepts it
(``--local`` for the one written for ``mlbench run --local``) and the operator's default admission policy admits
every run it holds against the catalog's task (the API server's side: tests/operator/test_admission_policy.py,
a cluster test). No cluster needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlbench_api import cli
from mlbench_operator.policy import AdmissionPolicy
from mlbench_operator.run import admission

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))
CATALOG = REPO / "manifests" / "catalog"
#: Examples written for ``mlbench run --local`` (their dataset path is the local machine's).
LOCAL = {"local-quick.yaml"}


def catalog_task(name: str) -> dict[str, object]:
    for path in CATALOG.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "BenchmarkTask" and doc["metadata"]["name"] == name:
                return dict(doc)
    raise AssertionError(f"no BenchmarkTask {name!r} in manifests/catalog")


def test_the_gpu_example_is_among_them() -> None:
    assert "gpu-nccl-resnet20.yaml" in {p.name for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_mlbench_validate_accepts_it(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--local"] if path.name in LOCAL else []
    rc = cli.main(["validate", *flags, str(path)])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("path", [p for p in EXAMPLES if p.name not in LOCAL], ids=lambda p: p.stem)
def test_the_default_policy_admits_its_runs(path: Path) -> None:
    runs = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "BenchmarkRun"]
    for doc in runs:
        body = {**doc, "metadata": {**doc["metadata"], "namespace": "ns", "uid": "u1"}}
        result = admission.admit(body, catalog_task(doc["spec"]["taskRef"]["name"]), policy=AdmissionPolicy())
        assert not isinstance(result, admission.Rejection), result
