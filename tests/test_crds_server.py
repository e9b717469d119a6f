"""Server-side validation of the generated CRDs: every example under
``tests/examples/valid`` is accepted and every one under
``tests/examples/invalid`` is rejected by the real kube-apiserver (OpenAPI
schema or CEL), with an error naming the field given in the example's
``test.mlbench.io/expect-field`` annotation.  Checked through kubectl and
through the Python client, both with server-side dry-run so nothing persists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.plugin import KubeCluster, crd_files

pytestmark = pytest.mark.cluster

EXAMPLES = Path(os.environ.get("MLBENCH_EXAMPLES_DIR", Path(__file__).parent / "examples"))
EXPECT = "test.mlbench.io/expect-field"
NAMESPACE = "default"


def _docs(directory: Path) -> list[Any]:
    out = []
    for f in sorted(directory.glob("*.yaml")):
        for i, doc in enumerate(d for d in yaml.safe_load_all(f.read_text()) if d):
            out.append(pytest.param(doc, id=f"{f.stem}#{i}" if i else f.stem))
    return out


VALID = _docs(EXAMPLES / "valid")
INVALID = _docs(EXAMPLES / "invalid")


def _resources() -> dict[str, tuple[str, str, bool]]:
    """kind -> (group, plural, namespaced), from the generated CRDs."""
    out = {}
    for f in crd_files():
        spec = yaml.safe_load(f.read_text())["spec"]
        out[spec["names"]["kind"]] = (spec["group"], spec["names"]["plural"], spec["scope"] == "Namespaced")
    return out


def _prepare(doc: dict[str, Any]) -> dict[str, Any]:
    """Send to a known namespace (dry-run persists nothing, so `default` is fine)."""
    doc = json.loads(json.dumps(doc))
    doc.get("metadata", {}).pop("namespace", None)
    return doc


def _expected_field(doc: dict[str, Any]) -> str:
    field = doc.get("metadata", {}).get("annotations", {}).get(EXPECT)
    assert field, f"invalid example {doc.get('metadata', {}).get('name')} lacks the {EXPECT} annotation"
    return str(field)


def _kubectl_apply(kube_cluster: KubeCluster, doc: dict[str, Any]) -> Any:
    return kube_cluster.kubectl(
        "-n",
        NAMESPACE,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=mlbench-tests",
        "-f",
        "-",
        "-o",
        "json",
        input=json.dumps(_prepare(doc)),
    )


def _client_create(kube_api: Any, doc: dict[str, Any]) -> Any:
    from kubernetes import client

    group, version = doc["apiVersion"].split("/")
    _, plural, namespaced = _resources()[doc["kind"]]
    api = client.CustomObjectsApi(kube_api)
    body = _prepare(doc)
    if namespaced:
        return api.create_namespaced_custom_object(
            group, version, NAMESPACE, plural, body, dry_run="All", field_validation="Strict"
        )
    return api.create_cluster_custom_object(group, version, plural, body, dry_run="All", field_validation="Strict")


def test_examples_exist() -> None:
    assert VALID, f"no valid examples in {EXAMPLES / 'valid'}"
    assert INVALID, f"no invalid examples in {EXAMPLES / 'invalid'}"
    kinds = set(_resources())
    for param in [*VALID, *INVALID]:
        doc = param.values[0]
        assert doc["kind"] in kinds, f"{param.id}: kind {doc['kind']} is not one of our CRDs {kinds}"


@pytest.mark.parametrize("doc", VALID)
def test_valid_example_accepted_by_kubectl(kube_cluster: KubeCluster, doc: dict[str, Any]) -> None:
    res = _kubectl_apply(kube_cluster, doc)
    assert res.returncode == 0, res.stderr
    accepted = json.loads(res.stdout)
    assert accepted["kind"] == doc["kind"]
    assert accepted["metadata"]["name"] == doc["metadata"]["name"]
    assert accepted["metadata"].get("uid"), "server did not process the object"


@pytest.mark.parametrize("doc", VALID)
def test_valid_example_accepted_by_client(kube_cluster: KubeCluster, kube_api: Any, doc: dict[str, Any]) -> None:
    accepted = _client_create(kube_api, doc)
    assert accepted["metadata"]["name"] == doc["metadata"]["name"]
    assert accepted["spec"], "server returned an empty spec"


@pytest.mark.parametrize("doc", INVALID)
def test_invalid_example_rejected_by_kubectl(kube_cluster: KubeCluster, doc: dict[str, Any]) -> None:
    field = _expected_field(doc)
    res = _kubectl_apply(kube_cluster, doc)
    assert res.returncode != 0, f"server accepted an invalid object:\n{res.stdout}"
    # 422 prints 'The <Kind> "<name>" is invalid', other rejections (unknown
    # fields: 400) 'Error from server'; either way the server said no
    assert "is invalid" in res.stderr or "Error from server" in res.stderr, res.stderr
    assert field in res.stderr, f"error does not mention {field!r}:\n{res.stderr}"


@pytest.mark.parametrize("doc", INVALID)
def test_invalid_example_rejected_by_client(kube_cluster: KubeCluster, kube_api: Any, doc: dict[str, Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    field = _expected_field(doc)
    with pytest.raises(ApiException) as excinfo:
        _client_create(kube_api, doc)
    # 422 Invalid for schema/CEL violations, 400 BadRequest for unknown fields
    # (strict field validation)
    assert excinfo.value.status in (400, 422), excinfo.value.body
    status = json.loads(str(excinfo.value.body))
    assert status["status"] == "Failure", status
    causes = status.get("details", {}).get("causes", [])
    assert field in status["message"] or any(field in c.get("field", "") for c in causes), status
