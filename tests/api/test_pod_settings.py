"""``spec.pod`` (issue 29): the shape the API takes, each refusal naming its field (no cluster needed)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mlbench_api import contract
from mlbench_api.pod import reserved_env
from mlbench_api.run import BenchmarkRunSpec

ONE_PER_NODE = {"placement": "OneWorkerPerNode"}


def spec(pod: dict[str, Any], **rest: Any) -> BenchmarkRunSpec:
    return BenchmarkRunSpec.model_validate({"taskRef": {"name": "t"}, "pod": pod, **rest})


@pytest.mark.parametrize(
    ("pod", "needle"),
    [
        ({"env": [{"name": "MLBENCH_RUN"}]}, "env: 'MLBENCH_RUN'"),
        ({"env": [{"name": "MASTER_ADDR", "value": "x"}]}, "env: 'MASTER_ADDR'"),
        ({"env": [{"name": "OMPI_COMM_WORLD_RANK"}]}, "env: 'OMPI_COMM_WORLD_RANK'"),
        ({"env": [{"name": "NCCL_DEBUG"}, {"name": "NCCL_DEBUG"}]}, "env: 'NCCL_DEBUG' is set twice"),
        ({"env": [{"name": "A=B"}]}, "env.0.name"),
        ({"env": [{"name": "1X"}]}, "env.0.name"),
        ({"annotations": {"mlbench.io/run": "x"}}, "annotations: 'mlbench.io/run'"),
        ({"labels": {"mlbench.io/attempt": "0"}}, "labels: 'mlbench.io/attempt'"),
        ({"labels": {"bad key": "x"}}, "labels: 'bad key' is not a valid key"),
        ({"labels": {"team": "not a value"}}, "labels.team"),
        ({"annotations": {"a/" + "n" * 64: "x"}}, "is not a valid key"),
        ({"extendedResources": {"nvidia.com/gpu": 1}}, "extendedResources: nvidia.com/gpu is resources.gpu's"),
        ({"extendedResources": {"efa": 1}}, "extendedResources: 'efa' is not an extended resource name"),
        ({"extendedResources": {"rdma/a": 0}}, "extendedResources.rdma/a"),
        ({"extendedResources": {f"x.io/r{i}": 1 for i in range(9)}}, "extendedResources"),
        ({"env": [{"name": f"N{i}"} for i in range(65)]}, "env"),
        ({"topologySpreadConstraints": [{}] * 9}, "topologySpreadConstraints"),
    ],
)
def test_refused_shapes_name_the_field(pod: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match="pod") as err:
        spec(pod)
    assert needle in str(err.value), str(err.value)


def test_an_accepted_pod_keeps_everything() -> None:
    pod = {
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "_X", "value": ""}],
        "annotations": {"k8s.v1.cni.cncf.io/networks": '[{"name": "rdma-net"}]'},
        "labels": {"team": "vision", "x.example.com/tier": ""},
        "extendedResources": {"rdma/hca_shared_devices_a": 1, "vpc.amazonaws.com/efa": 4},
        "affinity": {"nodeAffinity": {"anything": ["kept", "as", "given"]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}],
        "hostNetwork": True,
        "hostIpc": True,
    }
    assert spec(pod, scheduling=ONE_PER_NODE).to_api()["pod"] == pod


@pytest.mark.parametrize(
    ("rest", "needle"),
    [
        ({}, "pod.hostNetwork: needs scheduling.placement OneWorkerPerNode"),
        ({"scheduling": {"placement": "Spread"}}, "needs scheduling.placement OneWorkerPerNode"),
        ({"scheduling": ONE_PER_NODE, "network": {"latencyMs": 1}}, "pod.hostNetwork: not with network"),
    ],
)
def test_host_network_needs_one_worker_per_node_and_no_netem(rest: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        spec({"hostNetwork": True}, **rest)
    assert spec({"hostNetwork": False}, **rest)  # false asks nothing


def test_the_reserved_names_are_the_contracts() -> None:
    assert all(reserved_env(name) for name in contract.RESERVED_ENV)
    assert reserved_env(contract.ENV_FORWARD_ENV)
    assert not reserved_env("NCCL_DEBUG")
