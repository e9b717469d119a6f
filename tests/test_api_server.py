"""API behaviour only a real API server shows: immutability (CEL transition rules), the
status subresource, defaulting, and printer columns filled from status."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.plugin import KubeCluster, get_json

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "mlbench.io", "v1alpha1", "benchmarkruns"


def _run(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "BenchmarkRun",
        "metadata": {"name": name},
        "spec": {"taskRef": {"name": "cifar10-resnet20"}, "workers": 2},
    }


def _api(kube_api: Any) -> Any:
    """The custom-objects client, untyped: it returns plain JSON-shaped dicts."""
    return client.CustomObjectsApi(kube_api)


def _create(api: Any, namespace: str, name: str) -> dict[str, Any]:
    created: dict[str, Any] = api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _run(name))
    return created


def test_server_applies_schema_defaults(kube_api: Any, namespace: str) -> None:
    api = _api(kube_api)
    spec = _create(api, namespace, "defaults")["spec"]
    assert spec["backend"] == "gloo"
    assert spec["algorithm"] == "allreduce-sgd"
    assert spec["slotsPerWorker"] == 1
    assert spec["seed"] == 42


def test_spec_is_immutable_except_run_policy(kube_api: Any, namespace: str) -> None:
    api = _api(kube_api)
    _create(api, namespace, "immutable")
    with pytest.raises(ApiException) as info:
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "immutable", {"spec": {"workers": 4}})
    assert info.value.status == 422
    assert "spec is immutable except runPolicy, suspend and scheduling" in str(info.value.body)
    patched = api.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "immutable", {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 60}}}
    )
    assert patched["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 60
    assert patched["spec"]["workers"] == 2


@pytest.mark.parametrize(
    ("to", "accepted"),
    [
        ({"activeDeadlineSeconds": 600}, True),  # lowered: the operator fails the run at the new one
        ({"activeDeadlineSeconds": 3600}, True),  # unchanged
        ({"activeDeadlineSeconds": 7200}, False),  # raised: the pods would still die at the old one
        ({"activeDeadlineSeconds": None}, False),  # removed: the same
        ({"maxRestarts": 5}, True),  # the rest of runPolicy untouched
    ],
)
def test_the_run_deadline_may_be_lowered_not_raised_or_removed(
    kube_api: Any, namespace: str, to: dict[str, Any], accepted: bool
) -> None:
    api = _api(kube_api)
    name = "deadline"
    api.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        {**_run(name), "spec": {**_run(name)["spec"], "runPolicy": {"activeDeadlineSeconds": 3600}}},
    )
    try:
        patch = {"spec": {"runPolicy": to}}
        if accepted:
            api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)
            return
        with pytest.raises(ApiException) as info:
            api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)
        assert info.value.status == 422
        body = json.loads(info.value.body or "{}")
        assert body["details"]["causes"][0]["field"] == "spec.runPolicy.activeDeadlineSeconds"
        assert "may be lowered, not raised or removed" in body["message"]
    finally:
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def test_a_sweep_template_deadline_may_be_raised(kube_api: Any, namespace: str) -> None:
    """A template has no pods: its runPolicy edits apply to the runs created afterwards (docs/sweeps.md)."""
    api = _api(kube_api)
    template = {"taskRef": {"name": "cifar10-resnet20"}, "runPolicy": {"activeDeadlineSeconds": 600}}
    sweep = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "BenchmarkSweep",
        "metadata": {"name": "longer"},
        "spec": {"template": template, "matrix": {"seeds": [1, 2]}},
    }
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, "benchmarksweeps", sweep)
    patch = {"spec": {"template": {"runPolicy": {"activeDeadlineSeconds": 7200}}}}
    patched = api.patch_namespaced_custom_object(GROUP, VERSION, namespace, "benchmarksweeps", "longer", patch)
    assert patched["spec"]["template"]["runPolicy"]["activeDeadlineSeconds"] == 7200


def test_a_deadline_may_be_set_on_a_run_that_had_none(kube_api: Any, namespace: str) -> None:
    api = _api(kube_api)
    _create(api, namespace, "nodeadline")
    patch = {"spec": {"runPolicy": {"activeDeadlineSeconds": 60}}}
    patched = api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "nodeadline", patch)
    assert patched["spec"]["runPolicy"]["activeDeadlineSeconds"] == 60


def test_status_is_a_subresource(kube_api: Any, namespace: str) -> None:
    api = _api(kube_api)
    _create(api, namespace, "status")
    # A write to the main resource cannot set status ...
    api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "status", {"status": {"phase": "Running"}})
    assert "status" not in api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "status")
    # ... only the status subresource can, and it is validated too.
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "status", {"status": {"phase": "Running", "workers": {"ready": 2}}}
    )
    with pytest.raises(ApiException) as info:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "status", {"status": {"phase": "Exploded"}}
        )
    assert "status.phase" in str(info.value.body)


def test_printer_columns_show_status(kube_cluster: KubeCluster, kube_api: Any, namespace: str) -> None:
    api = _api(kube_api)
    _create(api, namespace, "columns")
    status = {
        "phase": "Succeeded",
        "progress": {
            **{"epoch": 40.96875, "epochRounded": "40.9", "lastAccuracy": 0.8012, "accuracy": "80.1%"},
            **{"lastScore": 0.8012, "score": "80.1%"},
        },
        "result": {
            **{"goalReached": True, "timeToGoalSeconds": 123.5, "timeToGoal": "2m04s"},
            **{"compressionRatio": 71.93456, "compression": "71.9x"},
        },
    }
    api.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "columns", {"status": status})
    out = kube_cluster.kubectl("get", "benchmarkruns", "-n", namespace, "columns").stdout
    header, row = out.splitlines()[:2]
    assert header.split()[:8] == ["NAME", "TASK", "WORKERS", "BACKEND", "PHASE", "EPOCH", "SCORE", "TIME-TO-GOAL"]
    assert row.split()[:8] == ["columns", "cifar10-resnet20", "2", "gloo", "Succeeded", "40.9", "80.1%", "2m04s"]
    wide = kube_cluster.kubectl("get", "benchmarkruns", "-n", namespace, "columns", "-o", "wide").stdout
    assert "71.9x" in wide.splitlines()[1], wide
    assert "71.93456" not in wide, wide  # the exact figure stays in the status
    bleu = {
        "phase": "Running",
        "progress": {"epoch": 3, "epochRounded": "3", "lastScore": 24.3125, "score": "24.3 BLEU"},
    }
    api.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "columns", {"status": bleu})
    row = kube_cluster.kubectl("get", "benchmarkruns", "-n", namespace, "columns").stdout.splitlines()[1]
    assert row.split()[4:8] == ["Running", "3", "24.3", "BLEU"], row  # the metric's own form


def test_field_selector_on_task(kube_cluster: KubeCluster, kube_api: Any, namespace: str) -> None:
    api = _api(kube_api)
    _create(api, namespace, "selected")
    other = _run("other")
    other["spec"]["taskRef"]["name"] = "epsilon-logreg"
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, other)
    listed = get_json(kube_cluster, "br", "-n", namespace, "--field-selector", "spec.taskRef.name=epsilon-logreg")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["other"]
    assert json.dumps(listed).count("cifar10-resnet20") == 0
