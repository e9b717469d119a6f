"""Whether a failed world's nodes still answer (:mod:`mlbench_operator.run.nodes`): the Node's Ready condition and
the kubelet's Lease, judged as the operator judges them when the launcher failed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mlbench_operator import conditions as c
from mlbench_operator.podview import PodView
from mlbench_operator.run import nodes
from mlbench_operator.run.nodes import NodeState

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def node(status: str = "True", reason: str = "KubeletReady", message: str = "kubelet is posting ready status") -> Any:
    return {
        "metadata": {"name": "n"},
        "status": {"conditions": [{"type": "Ready", "status": status, "reason": reason, "message": message}]},
    }


def lease(age: float | None) -> Any:
    renewed = None if age is None else c.timestamp(NOW - timedelta(seconds=age))
    return {"metadata": {"name": "n"}, "spec": {"holderIdentity": "n", "renewTime": renewed}}


@pytest.mark.parametrize(
    ("obj", "its_lease", "expected"),
    [
        pytest.param(node(), lease(3), NodeState(), id="renewed-recently"),
        pytest.param(node(), lease(12), NodeState(), id="one-renewal-late-is-normal"),
        pytest.param(node(), lease(15), NodeState(wait=5.0), id="late:wait-until-it-would-count"),
        pytest.param(node(), lease(20), NodeState(wait=0.0), id="exactly-two-renewals"),
        pytest.param(node(), lease(31), NodeState(silent="its kubelet last renewed its Lease 31 s ago"), id="silent"),
        pytest.param(
            node("Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status."),
            lease(3),
            NodeState(silent="Ready=Unknown, NodeStatusUnknown: Kubelet stopped posting node status."),
            id="the-controller-already-said",
        ),
        pytest.param(
            node("False", "", ""), None, NodeState(silent="Ready=False, NotReady: no message"), id="not-ready"
        ),
        pytest.param(None, lease(3), NodeState(silent="its Node object is gone"), id="node-deleted"),
        pytest.param(node(), None, NodeState(), id="no-lease:ready-decides"),
        pytest.param(node(), lease(None), NodeState(), id="lease-never-renewed"),
        pytest.param({"status": {}}, lease(3), NodeState(), id="no-conditions-yet"),
    ],
)
def test_judge(obj: Any, its_lease: Any, expected: NodeState) -> None:
    got = nodes.judge(obj, its_lease, NOW)
    assert got.silent == expected.silent
    assert got.wait == pytest.approx(expected.wait)


def view(name: str, role: str = "worker", rank: int | None = 0, node_name: str | None = "a", phase: str = "Running"):
    return PodView(name=name, role=role, rank=rank, attempt=0, phase=phase, node=node_name)


@pytest.mark.parametrize(
    ("workers", "launcher", "expected"),
    [
        pytest.param([view("w0"), view("w1", rank=1, node_name="b")], None, [], id="no-launcher"),
        pytest.param(
            [view("w0"), view("w1", rank=1, node_name="b")], view("l", "launcher", None), [], id="launcher-running"
        ),
        pytest.param(
            [view("w0", node_name="b"), view("w1", rank=1, node_name="a"), view("w2", rank=2, node_name="a")],
            view("l", "launcher", None, phase="Failed"),
            ["a", "b"],
            id="launcher-failed:each-node-once",
        ),
        pytest.param(
            [view("w0", node_name=None), view("w1", rank=1, phase="Failed")],
            view("l", "launcher", None, phase="Failed"),
            [],
            id="unbound-or-finished-workers",
        ),
    ],
)
def test_to_check(workers: list[PodView], launcher: PodView | None, expected: list[str]) -> None:
    assert nodes.to_check(workers, launcher) == expected


def test_lost_worker_names_the_first_rank_on_a_silent_node() -> None:
    workers = {1: view("w1", rank=1, node_name="b"), 0: view("w0", node_name="a"), 2: view("w2", rank=2, node_name="b")}
    states = {"a": NodeState(), "b": NodeState(silent="Ready=Unknown")}
    assert (
        nodes.lost_worker(workers, states) == "worker 1 (pod w1) is on node b, which stopped answering (Ready=Unknown)"
    )
    assert nodes.lost_worker(workers, {"a": NodeState(), "b": NodeState(wait=3.0)}) is None
    assert nodes.lost_worker(workers, {}) is None  # not read (the launcher did not fail): nothing is said


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({}, None),
        ({"a": NodeState(), "b": NodeState()}, None),
        ({"a": NodeState(wait=2.0), "b": NodeState(wait=6.5)}, 6.5),
    ],
)
def test_wait_is_the_latest_suspect(states: dict[str, NodeState], expected: float | None) -> None:
    assert nodes.wait(states) == expected
