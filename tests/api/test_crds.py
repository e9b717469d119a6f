"""The committed CRDs are fresh, structural, and carry the columns and rules users rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_api.crdgen import KINDS, crd, stale, write_all
from mlbench_api.run import IMMUTABLE_SPEC, SCHEDULING_WHILE_SUSPENDED, SUSPEND_FINISHED

BASES = Path(__file__).resolve().parents[2] / "crds" / "bases"


def _load(plural: str) -> dict[str, Any]:
    doc = yaml.safe_load((BASES / f"mlbench.io_{plural}.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def _schema(plural: str) -> dict[str, Any]:
    return _load(plural)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for name, child in node.get("properties", {}).items():
            out += _walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            out += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += _walk(node["additionalProperties"], f"{path}{{}}")
    return out


def test_committed_crds_are_up_to_date() -> None:
    assert stale(BASES) == [], "run `make crds` and commit the result"


def test_staleness_check_can_fail(tmp_path: Path) -> None:
    write_all(tmp_path)
    assert stale(tmp_path) == []
    target = tmp_path / KINDS[0].filename
    target.write_text(target.read_text().replace("maximum: 1024", "maximum: 2048"))
    (tmp_path / KINDS[1].filename).unlink()
    assert len(stale(tmp_path)) == 2


@pytest.mark.parametrize("plural", ["benchmarktasks", "benchmarkruns"])
def test_schema_is_structural(plural: str) -> None:
    for path, node in _walk(_schema(plural)):
        assert "$ref" not in node, path
        assert node.get("additionalProperties") is not False, path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            continue
        for combinator in ("anyOf", "allOf", "oneOf"):
            assert combinator not in node, path
        assert "type" in node, f"{path} has no type"
        if node["type"] == "array":
            assert "maxItems" in node, f"{path}: CEL cost estimation needs maxItems"


@pytest.mark.parametrize("plural", ["benchmarkruns", "benchmarksweeps"])
def test_a_quantity_keeps_its_branches_checks(plural: str) -> None:
    """The structural rewrite leaves bare types under anyOf; each branch's own check moves up to the node,
    where the server applies it to the values it fits: cpu: -2 was stored, then failed InvalidSpec."""
    quantities = [node for _, node in _walk(_schema(plural)) if node.get("x-kubernetes-int-or-string")]
    assert quantities
    for node in quantities:
        assert (node["minimum"], node["maxLength"]) == (0, 64)
        assert node["pattern"].startswith("^")


def test_names_scope_and_categories() -> None:
    tasks, runs = _load("benchmarktasks"), _load("benchmarkruns")
    assert tasks["spec"]["scope"] == "Cluster"
    assert runs["spec"]["scope"] == "Namespaced"
    assert tasks["spec"]["names"]["shortNames"] == ["bt"]
    assert runs["spec"]["names"]["shortNames"] == ["br"]
    for doc in (tasks, runs):
        assert doc["spec"]["group"] == "mlbench.io"
        assert doc["spec"]["names"]["categories"] == ["mlbench"]
        assert doc["spec"]["versions"][0]["name"] == "v1alpha1"


def test_run_has_status_subresource_and_printer_columns() -> None:
    version = _load("benchmarkruns")["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Task"] == ".spec.taskRef.name"
    assert columns["Workers"] == ".spec.workers"
    assert columns["Backend"] == ".spec.backend"
    assert columns["Algorithm"] == ".spec.algorithm"
    assert columns["Compression"] == ".status.result.compression"
    assert columns["Phase"] == ".status.phase"
    assert columns["Epoch"] == ".status.progress.epochRounded"
    assert columns["Time-To-Goal"] == ".status.result.timeToGoal"
    assert columns["Score"] == ".status.progress.score"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_conditions_are_a_list_map_keyed_by_type() -> None:
    conditions = _schema("benchmarkruns")["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    assert set(item["required"]) == {"type", "status", "reason", "lastTransitionTime"}
    assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]


def test_cel_rules_are_present() -> None:
    runs = _schema("benchmarkruns")
    root_rules = " ".join(r["rule"] for r in runs["x-kubernetes-validations"])
    assert "size(self.metadata.name) <= 51" in root_rules
    spec_rules = {r["message"]: r for r in runs["properties"]["spec"]["x-kubernetes-validations"]}
    assert spec_rules["nccl needs resources.gpu >= 1"]["fieldPath"] == ".backend"
    ddp = spec_rules["ddp needs backend gloo or nccl (torch.distributed), not mpi"]
    assert ddp["rule"] == "self.algorithm != 'ddp' || self.backend != 'mpi'"
    assert ddp["fieldPath"] == ".algorithm"
    immutable = spec_rules[IMMUTABLE_SPEC]["rule"]
    assert "self.taskRef == oldSelf.taskRef" in immutable
    assert "self.workers == oldSelf.workers" in immutable
    assert "runPolicy" not in immutable
    assert "self.managedBy" in immutable  # managedBy: immutable, as a Job's
    assert "self.suspend" not in immutable
    assert "self.scheduling" not in immutable
    scheduling = spec_rules[SCHEDULING_WHILE_SUSPENDED]
    assert scheduling["rule"].startswith("(has(oldSelf.suspend) && oldSelf.suspend) || ")
    assert scheduling["fieldPath"] == ".scheduling"
    finished = next(r for r in runs["x-kubernetes-validations"] if r["message"] == SUSPEND_FINISHED)
    assert "oldSelf.status.phase in ['Succeeded', 'Failed']" in finished["rule"]
    assert finished["fieldPath"] == ".spec.suspend"
    tasks = _schema("benchmarktasks")
    lr = tasks["properties"]["spec"]["properties"]["training"]["properties"]["learningRate"]
    assert any("isSorted" in r["rule"] for r in lr["x-kubernetes-validations"])


@pytest.mark.multiproc
def test_generation_is_deterministic() -> None:
    """The same models give the same CRDs in any process: set and dict orders that follow string hashing
    change with PYTHONHASHSEED, which is fixed within one process (so two calls here would agree anyway)."""
    script = "import json; from mlbench_api.crdgen import KINDS, crd; print(json.dumps([crd(k) for k in KINDS]))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1
    assert json.loads(outputs.pop()) == [crd(k) for k in KINDS]
