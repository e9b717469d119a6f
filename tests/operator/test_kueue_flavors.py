"""Each Kueue pod set's own flavors on its own pods: workers and launcher admitted on different flavors get each
their flavor's node labels and tolerations, not the union of both (no cluster; run/kueue.py)."""

from __future__ import annotations

from typing import Any

import pytest

from mlbench_operator import runpods
from mlbench_operator.run import admission, kueue
from tests.operator import helpers as h

Obj = dict[str, Any]
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
FLAVORS: dict[str, Obj] = {
    "gpu": {"spec": {"nodeLabels": {"pool": "gpu"}, "tolerations": [GPU_TAINT]}},
    "cpu": {"spec": {"nodeLabels": {"pool": "cpu"}}},
    "zone-a": {"spec": {"nodeLabels": {"zone": "a"}}},
    "plain": {"spec": {}},
}


def ctx(**spec: Any) -> Any:
    result = admission.admit(h.run(**spec), h.task(), policy=h.PERMISSIVE)
    assert not isinstance(result, admission.Rejection), result
    return result[0]


def scheduling_of(pod: Obj) -> tuple[Obj | None, list[Obj]]:
    spec = pod["spec"]
    tolerations = [t for t in spec.get("tolerations", []) if t.get("key") == GPU_TAINT["key"]]
    return spec.get("nodeSelector"), tolerations


CASES: list[tuple[str, dict[str, list[str]], Obj | None, list[Obj], Obj | None, list[Obj]]] = [
    # (id, flavors per pod set, the workers' nodeSelector and GPU tolerations, the launcher's)
    ("same-flavor", {"workers": ["cpu"], "launcher": ["cpu"]}, {"pool": "cpu"}, [], {"pool": "cpu"}, []),
    (
        "gpu-workers-cpu-launcher",
        {"workers": ["gpu"], "launcher": ["cpu"]},
        {"pool": "gpu"},
        [GPU_TAINT],
        {"pool": "cpu"},
        [],
    ),
    ("launcher-unlabelled", {"workers": ["gpu"], "launcher": ["plain"]}, {"pool": "gpu"}, [GPU_TAINT], None, []),
    (  # a pod set with two flavors (one per resource): both flavors' labels, on that pod set only
        "two-flavors-in-one-set",
        {"workers": ["gpu", "zone-a"], "launcher": ["cpu"]},
        {"pool": "gpu", "zone": "a"},
        [GPU_TAINT],
        {"pool": "cpu"},
        [],
    ),
    ("no-assignment", {}, None, [], None, []),
]


@pytest.mark.parametrize(
    ("assigned", "workers_selector", "workers_tolerations", "launcher_selector", "launcher_tolerations"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_each_pod_set_gets_its_own_flavors(
    assigned: dict[str, list[str]],
    workers_selector: Obj | None,
    workers_tolerations: list[Obj],
    launcher_selector: Obj | None,
    launcher_tolerations: list[Obj],
) -> None:
    placed = kueue.placed(ctx(), list(assigned.items()), FLAVORS)
    assert scheduling_of(runpods.worker_pod(placed, 0, 0)) == (workers_selector, workers_tolerations)
    assert scheduling_of(runpods.launcher_pod(placed, 0)) == (launcher_selector, launcher_tolerations)


def test_the_runs_own_node_selector_stays_on_both() -> None:
    placed = kueue.placed(
        ctx(scheduling={"nodeSelector": {"kubernetes.io/arch": "amd64"}}),
        [("workers", ["gpu"]), ("launcher", ["cpu"])],
        FLAVORS,
    )
    assert runpods.worker_pod(placed, 0, 0)["spec"]["nodeSelector"] == {"kubernetes.io/arch": "amd64", "pool": "gpu"}
    assert runpods.launcher_pod(placed, 0)["spec"]["nodeSelector"] == {"kubernetes.io/arch": "amd64", "pool": "cpu"}


def test_admission_reads_each_pod_sets_flavors() -> None:
    wl = {
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "True"},
                {"type": "Admitted", "status": "True"},
            ],
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {"name": "workers", "flavors": {"cpu": "gpu", "nvidia.com/gpu": "gpu", "memory": "zone-a"}},
                    {"name": "launcher", "flavors": {"cpu": "cpu"}},
                ],
            },
        }
    }
    got = kueue.admission(wl, "wl", "q")
    assert got.admitted
    assert got.flavors == ("cpu", "gpu", "zone-a")
    assert got.assignments == (("workers", ("gpu", "zone-a")), ("launcher", ("cpu",)))
