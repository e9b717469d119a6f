"""``spec.pod`` under the admin's admission policy (issue 29): each setting that widens privilege is refused by
default, and every refusal names its field and the variable that would allow it (no cluster needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from mlbench_operator import policy as p
from mlbench_operator.conditions import Reason
from mlbench_operator.env import SettingsError
from mlbench_operator.run import admission
from tests.operator import helpers as h

Obj = dict[str, Any]
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
CP = "node-role.kubernetes.io/control-plane"


def node_affinity(*requirements: Obj, preferred: bool = False) -> Obj:
    term = {"matchExpressions": list(requirements)}
    if preferred:
        return {"nodeAffinity": {PREFERRED: [{"weight": 1, "preference": term}]}}
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [term]}}}


def req(key: str, operator: str = "In", *values: str) -> Obj:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


@dataclass(frozen=True)
class Case:
    id: str
    pod: Obj
    #: None: admitted; else what the refusal must say (the field, then the rule)
    refused: tuple[str, ...] | None = None
    settings: dict[str, str] = field(default_factory=dict)


CASES = [
    # the defaults: the collectives' variables, Multus, the GPU, any pod anti-affinity or spread
    Case("nccl-env", {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_IB_HCA", "value": "mlx5"}]}),
    Case(
        "ucx-efa-env", {"env": [{"name": "UCX_TLS", "value": "rc"}, {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}]}
    ),
    Case("multus", {"annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"}}),
    Case("spread", {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}]}),
    Case("zone-affinity", {"affinity": node_affinity(req("topology.kubernetes.io/zone", "In", "a"))}),
    Case("narrowing-affinity", {"affinity": node_affinity(req(CP, "DoesNotExist"), req("pool", "NotIn", "x"))}),
    Case("pod-affinity", {"affinity": {"podAffinity": {PREFERRED: []}}}),
    Case("host-network-false", {"hostNetwork": False, "hostIpc": False}),
    # refused by default, each naming the field and the variable
    Case(
        "ld-preload",
        {"env": [{"name": "LD_PRELOAD", "value": "/data/x.so"}]},
        ("spec.pod.env[0]", "MLBENCH_ALLOWED_ENV"),
    ),
    Case(
        "path", {"env": [{"name": "NCCL_DEBUG"}, {"name": "PATH"}]}, ("spec.pod.env[1]: 'PATH'", "MLBENCH_ALLOWED_ENV")
    ),
    Case("pythonpath", {"env": [{"name": "PYTHONPATH", "value": "/data"}]}, ("spec.pod.env[0]", "MLBENCH_ALLOWED_ENV")),
    Case("ompi-mca", {"env": [{"name": "OMPI_MCA_plm_rsh_agent", "value": "sh"}]}, ("spec.pod.env[0]",)),
    Case(
        "istio-annotation",
        {"annotations": {"sidecar.istio.io/inject": "true"}},
        ("spec.pod.annotations: key 'sidecar.istio.io/inject'", "MLBENCH_ALLOWED_POD_ANNOTATIONS"),
    ),
    Case("label", {"labels": {"app": "web"}}, ("spec.pod.labels: key 'app'", "MLBENCH_ALLOWED_POD_LABELS")),
    Case(
        "rdma",
        {"extendedResources": {"rdma/hca_shared_devices_a": 1}},
        ("spec.pod.extendedResources: 'rdma/hca_shared_devices_a'", "MLBENCH_ALLOWED_EXTENDED_RESOURCES: none"),
    ),
    Case("host-network", {"hostNetwork": True}, ("spec.pod.hostNetwork", "MLBENCH_ALLOW_HOST_NETWORK")),
    Case("host-ipc", {"hostIpc": True}, ("spec.pod.hostIpc", "MLBENCH_ALLOW_HOST_IPC")),
    Case(
        "affinity-unlisted-key",
        {"affinity": node_affinity(req("dedicated", "In", "a"))},
        (
            "spec.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
            ".matchExpressions[0]: 'dedicated'",
            "MLBENCH_ALLOWED_NODE_SELECTOR_KEYS",
        ),
    ),
    Case(
        "affinity-control-plane",
        {"affinity": node_affinity(req(CP, "Exists"), preferred=True)},
        ("preference.matchExpressions[0]: 'node-role.kubernetes.io/control-plane'", "MLBENCH_ALLOW_CONTROL_PLANE"),
    ),
    # widened by the admin
    Case("allowed-rdma", {"extendedResources": {"rdma/a": 1}}, None, {"MLBENCH_ALLOWED_EXTENDED_RESOURCES": "rdma/*"}),
    Case(
        "allowed-efa-not-rdma",
        {"extendedResources": {"rdma/a": 1, "vpc.amazonaws.com/efa": 4}},
        ("'rdma/a'", "MLBENCH_ALLOWED_EXTENDED_RESOURCES: vpc.amazonaws.com/efa"),
        {"MLBENCH_ALLOWED_EXTENDED_RESOURCES": "vpc.amazonaws.com/efa"},
    ),
    Case("allowed-host-network", {"hostNetwork": True}, None, {"MLBENCH_ALLOW_HOST_NETWORK": "true"}),
    Case(
        "host-network-is-not-ipc",
        {"hostNetwork": True, "hostIpc": True},
        ("spec.pod.hostIpc",),
        {"MLBENCH_ALLOW_HOST_NETWORK": "true"},
    ),
    Case("allowed-host-ipc", {"hostIpc": True}, None, {"MLBENCH_ALLOW_HOST_IPC": "true"}),
    Case(
        "allowed-ompi",
        {"env": [{"name": "OMPI_MCA_btl_tcp_if_include"}]},
        None,
        {"MLBENCH_ALLOWED_ENV": "OMPI_MCA_btl_*"},
    ),
    Case(
        "allowed-env-replaces-default",
        {"env": [{"name": "NCCL_DEBUG"}]},
        ("spec.pod.env[0]", "MLBENCH_ALLOWED_ENV: OMPI_MCA_btl_*"),
        {"MLBENCH_ALLOWED_ENV": "OMPI_MCA_btl_*"},
    ),
    Case("allowed-label", {"labels": {"team": "a"}}, None, {"MLBENCH_ALLOWED_POD_LABELS": "team"}),
    Case("allowed-annotation", {"annotations": {"x.io/y": "1"}}, None, {"MLBENCH_ALLOWED_POD_ANNOTATIONS": "x.io/*"}),
    Case(
        "allowed-affinity-key",
        {"affinity": node_affinity(req("dedicated", "In", "a"))},
        None,
        {"MLBENCH_ALLOWED_NODE_SELECTOR_KEYS": "dedicated"},
    ),
    Case("allowed-control-plane", {"affinity": node_affinity(req(CP))}, None, {"MLBENCH_ALLOW_CONTROL_PLANE": "true"}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_pod_settings_under_the_policy(case: Case) -> None:
    """Through the operator's admission: admitted, or PolicyViolation naming the field and the rule."""
    policy = p.AdmissionPolicy.from_env(case.settings)
    one_per_node = {"placement": "OneWorkerPerNode"}  # what the API asks of hostNetwork; the policy ignores it
    result = admission.admit(h.run(pod=case.pod, scheduling=one_per_node), h.task(), policy=policy)
    if case.refused is None:
        assert not isinstance(result, admission.Rejection), result
        return
    assert isinstance(result, admission.Rejection), case.id
    assert result.reason == Reason.POLICY_VIOLATION, result
    for needle in case.refused:
        assert needle in result.message, result.message
    assert "(MLBENCH_ALLOW" in result.message


def test_every_refusal_is_listed_at_once() -> None:
    pod = {"env": [{"name": "LD_PRELOAD"}], "hostNetwork": True, "hostIpc": True, "labels": {"a": "b"}}
    problems = p.check_pod(pod, p.AdmissionPolicy())
    assert [x.split(":")[0] for x in problems] == [
        "spec.pod.env[0]",
        "spec.pod.labels",
        "spec.pod.hostNetwork",
        "spec.pod.hostIpc",
    ]


def test_pod_settings_from_env() -> None:
    pol = p.AdmissionPolicy.from_env(
        {
            "MLBENCH_ALLOWED_ENV": "NCCL_*, OMPI_MCA_btl_*",
            "MLBENCH_ALLOWED_POD_ANNOTATIONS": "k8s.v1.cni.cncf.io/*",
            "MLBENCH_ALLOWED_POD_LABELS": "team",
            "MLBENCH_ALLOWED_EXTENDED_RESOURCES": "rdma/*,vpc.amazonaws.com/efa",
            "MLBENCH_ALLOW_HOST_NETWORK": "true",
            "MLBENCH_ALLOW_HOST_IPC": "TRUE",
        }
    )
    assert pol.env_names == ("NCCL_*", "OMPI_MCA_btl_*")
    assert pol.pod_annotations == ("k8s.v1.cni.cncf.io/*",)
    assert pol.pod_labels == ("team",)
    assert pol.extended_resources == ("rdma/*", "vpc.amazonaws.com/efa")
    assert pol.allow_host_network
    assert pol.allow_host_ipc
    default = p.AdmissionPolicy.from_env({})
    assert (default.env_names, default.pod_annotations) == (p.DEFAULT_ENV_NAMES, p.DEFAULT_POD_ANNOTATIONS)
    assert not (default.pod_labels)
    assert not (default.extended_resources)
    assert not (default.allow_host_network)


@pytest.mark.parametrize(
    "env",
    [
        {"MLBENCH_ALLOW_HOST_NETWORK": "yes"},
        {"MLBENCH_ALLOW_HOST_IPC": "1"},
        {"MLBENCH_ALLOWED_ENV": "NCCL_[A-Z]*"},
        {"MLBENCH_ALLOWED_EXTENDED_RESOURCES": "rdma/*,,x"},
        {"MLBENCH_ALLOWED_POD_LABELS": "[ab]"},
        {"MLBENCH_ALLOWED_POD_ANNOTATIONS": "a,,b"},
    ],
)
def test_bad_pod_settings_name_the_variable(env: dict[str, str]) -> None:
    (name,) = env
    with pytest.raises(SettingsError, match=name):
        p.AdmissionPolicy.from_env(env)
