"""BenchmarkSweep: the expansion (order, names, labels), its limits, and errors that name the field."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_api.badinput import EXIT_BAD_INPUT
from mlbench_api.common import DNS1035_LABEL
from mlbench_api.crdgen import KINDS
from mlbench_api.errors import InvalidObject
from mlbench_api.run import MAX_RUN_NAME, Backend, BenchmarkRun
from mlbench_api.sweep import (
    HASH_LENGTH,
    LABEL_ALGORITHM,
    LABEL_BACKEND,
    LABEL_SEED,
    LABEL_SWEEP,
    LABEL_WORKERS,
    MAX_SWEEP_RUNS,
    BenchmarkSweep,
    FailurePolicy,
    expand,
    parse_sweep,
    run_name,
)
from mlbench_api.training import Algorithm

REPO = Path(__file__).resolve().parents[2]
BASES = REPO / "crds" / "bases"


def sweep_doc(name: str = "study", matrix: dict[str, Any] | None = None, **template: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": {"taskRef": {"name": "t"}, **template}}
    if matrix is not None:
        spec["matrix"] = matrix
    return {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkSweep", "metadata": {"name": name}, "spec": spec}


def names(doc: dict[str, Any]) -> list[str]:
    return [r.name for r in expand(parse_sweep(doc))]


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidObject) as info:
        parse_sweep(doc)
    return info.value.problems


# -- the expansion ---------------------------------------------------------------------------------------------
def test_order_is_workers_algorithms_backends_then_seeds_as_listed() -> None:
    matrix = {"workers": [4, 1], "algorithms": ["ddp", "allreduce-sgd"], "backends": ["gloo"], "seeds": [7, 3]}
    runs = expand(parse_sweep(sweep_doc(matrix=matrix)))
    assert [(r.point.workers, r.point.algorithm.value, r.point.backend.value, r.point.seed) for r in runs] == [
        (4, "ddp", "gloo", 7),
        (4, "ddp", "gloo", 3),
        (4, "allreduce-sgd", "gloo", 7),
        (4, "allreduce-sgd", "gloo", 3),
        (1, "ddp", "gloo", 7),
        (1, "ddp", "gloo", 3),
        (1, "allreduce-sgd", "gloo", 7),
        (1, "allreduce-sgd", "gloo", 3),
    ]
    assert [r.name for r in runs][:3] == ["study-w4-ddp-gloo-s7", "study-w4-ddp-gloo-s3", "study-w4-ar-gloo-s7"]
    assert expand(parse_sweep(sweep_doc(matrix=matrix))) == runs  # deterministic


@pytest.mark.parametrize(
    ("matrix", "expected"),
    [
        (None, ["study"]),
        ({}, ["study"]),
        ({"seeds": [1, 2]}, ["study-s1", "study-s2"]),
        ({"workers": [2], "seeds": [5]}, ["study-w2-s5"]),
        ({"workers": [1, 2], "seeds": [1, 2]}, ["study-w1-s1", "study-w1-s2", "study-w2-s1", "study-w2-s2"]),
        ({"backends": ["gloo", "mpi"]}, ["study-gloo", "study-mpi"]),
        ({"algorithms": ["allreduce-sgd", "ddp"]}, ["study-ar", "study-ddp"]),
    ],
)
def test_names_spell_the_dimensions_the_matrix_lists(matrix: dict[str, Any] | None, expected: list[str]) -> None:
    assert names(sweep_doc(matrix=matrix)) == expected


def test_unlisted_dimensions_keep_the_template_values() -> None:
    doc = sweep_doc(matrix={"seeds": [1, 2]}, workers=3, backend="mpi", algorithm="allreduce-sgd", seed=99)
    for run in expand(parse_sweep(doc)):
        assert (run.spec.workers, run.spec.backend, run.spec.algorithm) == (3, Backend.MPI, Algorithm.ALLREDUCE_SGD)
    assert [r.spec.seed for r in expand(parse_sweep(doc))] == [1, 2]


def test_every_run_is_a_valid_benchmark_run_with_the_sweep_labels() -> None:
    doc = sweep_doc(matrix={"workers": [1, 2], "seeds": [9]}, resources={"cpu": "500m"}, runPolicy={"maxRestarts": 0})
    doc["metadata"]["labels"] = {"team": "vision", LABEL_SWEEP: "not-this"}
    for run in expand(parse_sweep(doc)):
        obj = run.to_api("ns1")
        parsed = BenchmarkRun.model_validate(obj)
        assert parsed.metadata.namespace == "ns1"
        assert parsed.spec.resources is not None
        assert parsed.spec.resources.cpu == "500m"
        assert parsed.spec.run_policy is not None
        assert parsed.spec.run_policy.max_restarts == 0
        assert obj["metadata"]["labels"] == {
            "team": "vision",  # the sweep's own labels are copied
            LABEL_SWEEP: "study",  # ours win
            LABEL_WORKERS: str(run.point.workers),
            LABEL_ALGORITHM: "allreduce-sgd",
            LABEL_BACKEND: "gloo",
            LABEL_SEED: "9",
        }
        assert "ownerReferences" not in obj["metadata"]  # the operator's to add


def test_long_names_end_in_a_stable_hash() -> None:
    sweep = "a" * MAX_RUN_NAME  # the longest sweep name allowed
    matrix = {"workers": [1, 1024], "seeds": [0, 2**31 - 1]}
    got = names(sweep_doc(sweep, matrix=matrix))
    assert len(set(got)) == 4
    for name in got:
        assert len(name) == MAX_RUN_NAME
        assert re.match(DNS1035_LABEL, name), name
        assert re.fullmatch(rf"a+-[0-9a-f]{{{HASH_LENGTH}}}", name), name
    assert names(sweep_doc(sweep, matrix=matrix)) == got  # stable across calls (and processes: sha256)
    assert run_name("s", ["w1"]) == "s-w1"
    assert run_name(sweep, ["w1"]) == run_name(sweep, ["w1"]) != run_name(sweep, ["w2"])


def test_names_just_short_enough_are_kept() -> None:
    sweep = "s" * (MAX_RUN_NAME - len("-w2-s1"))
    assert names(sweep_doc(sweep, matrix={"workers": [2], "seeds": [1]})) == [f"{sweep}-w2-s1"]
    longer = names(sweep_doc(sweep + "x", matrix={"workers": [2], "seeds": [1]}))[0]
    assert len(longer) == MAX_RUN_NAME
    assert not longer.endswith("-s1")


def test_the_largest_expansion_is_allowed() -> None:
    doc = sweep_doc(matrix={"workers": [1, 2], "algorithms": ["allreduce-sgd", "ddp"], "seeds": list(range(64))})
    assert len(names(doc)) == MAX_SWEEP_RUNS


def test_defaults() -> None:
    sweep = parse_sweep(sweep_doc())
    assert sweep.spec.max_concurrent == 1
    assert sweep.spec.failure_policy is FailurePolicy.CONTINUE
    assert isinstance(sweep, BenchmarkSweep)


# -- validation names the field ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        (sweep_doc(matrix={"backends": ["gloo", "nccl"]}), "spec.matrix.backends", "nccl needs resources.gpu"),
        (
            sweep_doc(matrix={"algorithms": ["ddp"], "backends": ["gloo", "mpi"]}),
            "spec.matrix.algorithms",
            "ddp needs backend gloo or nccl",
        ),
        (sweep_doc(matrix={"algorithms": ["ddp"]}, backend="mpi"), "spec.matrix.algorithms", "not mpi"),
        (sweep_doc(matrix={"backends": ["mpi"]}, algorithm="ddp"), "spec.matrix.backends", "not mpi"),
        (sweep_doc(backend="nccl"), "spec.template.backend", "nccl needs resources.gpu"),
        (sweep_doc(matrix={"workers": [1, 1]}), "spec.matrix.workers", "unique"),
        (sweep_doc(matrix={"seeds": [1, 2, 1]}), "spec.matrix.seeds", "unique"),
        (sweep_doc(matrix={"workers": [0]}), "spec.matrix.workers.0", "greater than or equal to 1"),
        (sweep_doc(matrix={"workers": []}), "spec.matrix.workers", "at least 1"),
        (sweep_doc(matrix={"backends": ["tcp"]}), "spec.matrix.backends.0", "gloo"),
        (sweep_doc(matrix={"workers": [1, 2, 3], "seeds": list(range(86))}), "spec.matrix", "258 runs"),
        (sweep_doc(matrix={"gpus": [1]}), "spec.matrix.gpus", "Extra inputs"),
        (sweep_doc("Study"), "metadata.name", "DNS-1035"),
        (sweep_doc("s" * (MAX_RUN_NAME + 1)), "metadata.name", f"at most {MAX_RUN_NAME}"),
        ({**sweep_doc(), "spec": {**sweep_doc()["spec"], "maxConcurrent": 0}}, "spec.maxConcurrent", "greater"),
        ({**sweep_doc(), "spec": {**sweep_doc()["spec"], "failurePolicy": "Retry"}}, "spec.failurePolicy", "Stop"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_invalid_sweeps_name_the_field(doc: dict[str, Any], field: str, words: str) -> None:
    found = problems(doc)
    assert any(p.startswith(f"{field}: ") and words in p for p in found), found


def test_an_invalid_combination_names_the_run() -> None:
    (problem,) = problems(sweep_doc(matrix={"workers": [1, 2], "backends": ["gloo", "nccl"]}))
    assert "workers=1 algorithm=allreduce-sgd backend=nccl seed=42" in problem


def test_nccl_with_gpus_is_fine() -> None:
    doc = sweep_doc(matrix={"backends": ["gloo", "nccl"]}, resources={"gpu": 1})
    assert names(doc) == ["study-gloo", "study-nccl"]


# -- the CRD ---------------------------------------------------------------------------------------------------
def crd() -> dict[str, Any]:
    doc = yaml.safe_load((BASES / "mlbench.io_benchmarksweeps.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_crd_names_scope_and_printer_columns() -> None:
    doc = crd()
    assert doc["spec"]["scope"] == "Namespaced"
    assert doc["spec"]["names"]["shortNames"] == ["bsw"]
    assert doc["spec"]["names"]["categories"] == ["mlbench"]
    version = doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: (c["jsonPath"], c.get("priority", 0)) for c in version["additionalPrinterColumns"]}
    assert [n for n, (_, p) in columns.items() if p == 0] == ["Total", "Running", "Succeeded", "Failed", "Age"]
    assert columns["Total"][0] == ".status.total"
    assert columns["Running"][0] == ".status.running"
    assert columns["Succeeded"][0] == ".status.succeeded"
    assert columns["Failed"][0] == ".status.failed"
    assert "BenchmarkSweep" in [k.kind for k in KINDS]


def test_crd_rules_mirror_the_model() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root = " ".join(r["rule"] for r in schema["x-kubernetes-validations"])
    assert f"size(self.metadata.name) <= {MAX_RUN_NAME}" in root
    spec = schema["properties"]["spec"]
    rules = [(r["fieldPath"], r["rule"]) for r in spec["x-kubernetes-validations"]]
    assert any(path == ".matrix.backends" and "'nccl' in self.matrix.backends" in rule for path, rule in rules)
    assert any(path == ".matrix.algorithms" and "'ddp' in self.matrix.algorithms" in rule for path, rule in rules)
    assert any(path == ".matrix" and f"<= {MAX_SWEEP_RUNS}" in rule for path, rule in rules)
    assert any(path == ".matrix" and "oldSelf.matrix" in rule for path, rule in rules)
    for dim in ("workers", "seeds", "algorithms", "backends"):
        assert spec["properties"]["matrix"]["properties"][dim]["x-kubernetes-list-type"] == "set"
    # the template is a run spec, rules included
    template = spec["properties"]["template"]
    assert any(r.get("fieldPath") == ".backend" for r in template["x-kubernetes-validations"])
    assert template["required"] == ["taskRef"]


def test_example_manifest_expands() -> None:
    doc = yaml.safe_load((REPO / "manifests" / "examples" / "sweep-epsilon-logreg.yaml").read_text())
    runs = expand(parse_sweep(copy.deepcopy(doc)))
    assert len(runs) == 9
    assert runs[0].name == "epsilon-scaling-w1-s1"
    assert runs[0].spec.task_ref.name == "epsilon-logreg-synthetic"


def test_the_cli_validates_and_expands_sweeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mlbench_api import cli

    example = REPO / "manifests" / "examples" / "sweep-epsilon-logreg.yaml"
    assert cli.main(["validate", str(example)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(example.read_text().replace("workers: [1, 2, 4]", 'workers: ["1", 2]'))
    assert cli.main(["validate", str(bad)]) == EXIT_BAD_INPUT
    assert "spec.matrix.workers" in capsys.readouterr().err
    assert cli.main(["sweep", str(example)]) == 0
    assert capsys.readouterr().out.count("kind: BenchmarkRun") == 9
