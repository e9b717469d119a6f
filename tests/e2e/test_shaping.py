"""``spec.network`` between real nodes: a bandwidth cap on the workers' egress makes the same run spend a larger
share of its step time communicating.

Two runs of the e2e task, one worker per node so every collective crosses from one node to the other, one after
the other (side by side they would share the machine's 2 cores): uncapped, then with ``bandwidthMbit`` on every
worker (tc htb in each worker pod's namespace, set by the netem init container). The test prints both
communication shares and their ratio, and checks only the direction: at 20 Mbit/s ResNet-20's 1.1 MB of gradients
take about half a second a step, against a few milliseconds between the test nodes uncapped. The nodes share one
VM's cores: the absolute times are not results.

The init container runs as root with NET_ADMIN, which only a ``privileged`` namespace admits (docs/network.md),
and the e2e operator allows network emulation (``MLBENCH_ALLOW_NETWORK_EMULATION``, tests/e2e/deploy).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tests.cluster.plugin import create_namespace
from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.e2e, pytest.mark.slow]

CAP_MBIT = 20


def communication_share(result: dict[str, Any]) -> float:
    """Communication seconds over compute plus communication seconds, from ``status.result``."""
    comm, compute = result["communicationSeconds"], result["computeSeconds"]
    return float(comm / (comm + compute))


def test_communication_share_is_the_fraction_of_step_time_spent_communicating() -> None:
    assert communication_share({"communicationSeconds": 1.0, "computeSeconds": 3.0}) == 0.25


def test_a_bandwidth_cap_between_nodes_raises_the_communication_share(e2e: E2E, e2e_task: str) -> None:
    if len(e2e.real_nodes) < 2:
        pytest.skip(f"one real node only ({e2e.real_nodes}): no traffic between nodes to cap")
    namespace = create_namespace(e2e.cluster, pod_security="privileged")
    shaped = dataclasses.replace(e2e, namespace=namespace, tasks=[])
    scheduling = {**e2e.scheduling, "placement": "OneWorkerPerNode"}
    shares = {}
    try:
        for name, network in (("uncapped", None), ("capped", {"bandwidthMbit": CAP_MBIT})):
            extra = {"network": network} if network else {}
            run = shaped.run(name, e2e_task, scheduling=scheduling, **extra)
            st = shaped.wait_finished(run, timeout=900)
            assert st.get("phase") == "Succeeded", f"{run}: {json.dumps(st)[:2000]}\n{shaped.debug(run)}"
            shares[name] = communication_share(st["result"])
            print(f"\n{run}: communication share {shares[name]:.3f} ({json.dumps(st['result'])[:400]})")
        ratio = shares["capped"] / shares["uncapped"]
        print(f"capped at {CAP_MBIT} Mbit/s / uncapped communication share: {ratio:.1f}x")
        assert shares["capped"] > shares["uncapped"], shares
    finally:
        e2e.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
