"""spec.network against the real control plane: the API server stores it, the test operator (default
policy) refuses it, and the Pod Security admission plugin judges the worker pods.

The netem init container runs as root with NET_ADMIN: docs/network.md says namespaces enforcing
``restricted`` or ``baseline`` reject such workers and ``privileged`` admits them. Server-side dry runs
of the very pods the builder makes, in namespaces labelled with each level, check exactly that.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from mlbench_operator import conditions as c
from mlbench_operator import runpods
from mlbench_operator.run import admission
from tests.cluster.plugin import KubeCluster
from tests.operator import helpers as h
from tests.operator.conftest import Runs

pytestmark = pytest.mark.cluster

ALLOWED = dataclasses.replace(h.PERMISSIVE, allow_network_emulation=True)


def worker(namespace: str, **spec: Any) -> dict[str, Any]:
    result = admission.admit(h.run(namespace=namespace, **spec), h.task(), policy=ALLOWED)
    assert not isinstance(result, admission.Rejection), result
    pod = runpods.worker_pod(result[0], 0, 0)
    del pod["metadata"]["ownerReferences"]  # no such run in this namespace
    return pod


# The test namespaces enforce restricted; this test needs each level (the netem init container runs as root with
# NET_ADMIN, which restricted and baseline forbid and only privileged admits), so it opts out per level.
WHY = "shows which Pod Security level admits the netem init container (root, NET_ADMIN)"


@pytest.mark.parametrize(
    ("level", "admitted"),
    [
        pytest.param("restricted", False, id="restricted"),  # the test namespaces' default
        pytest.param("baseline", False, marks=pytest.mark.pod_security("baseline", reason=WHY), id="baseline"),
        pytest.param("privileged", True, marks=pytest.mark.pod_security("privileged", reason=WHY), id="privileged"),
    ],
)
def test_network_workers_need_a_privileged_namespace(
    kube_cluster: KubeCluster, namespace: str, level: str, admitted: bool
) -> None:
    ns = json.loads(kube_cluster.kubectl("get", "namespace", namespace, "-o", "json", check=True).stdout)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == level

    def create(pod: dict[str, Any]) -> tuple[int, str]:
        done = kube_cluster.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(pod))
        return done.returncode, done.stderr

    code, err = create(worker(namespace, network={"latencyMs": 5}))
    assert (code == 0) == admitted, err
    if not admitted:
        assert "violates PodSecurity" in err
        assert "NET_ADMIN" in err
        assert runpods.NETEM_CONTAINER in err
    plain_code, plain_err = create(worker(namespace))  # the control: the same worker without spec.network
    assert plain_code == 0, plain_err


def test_the_operator_refuses_network_by_default_and_creates_nothing(runs: Runs) -> None:
    runs.apply(h.run("shaped", network={"latencyMs": 5, "bandwidthMbit": 100}))
    status = runs.wait_phase("shaped", "Failed")
    failed = c.get(status.get("conditions"), "Failed")
    assert failed is not None
    assert failed["reason"] == "PolicyViolation"
    assert status["message"].startswith("spec.network: ")
    assert "MLBENCH_ALLOW_NETWORK_EMULATION=true" in status["message"]
    assert runs.pods("shaped") == {}
    assert runs.get("configmap", "shaped-config") is None
