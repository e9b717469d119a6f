"""The run's NetworkPolicy: who may reach its pods (pure builder; test_cluster_lifecycle has the API server
accept it)."""

from __future__ import annotations

import pytest

from mlbench_operator import netpol, settings
from mlbench_operator.env import SettingsError
from mlbench_operator.run import admission
from tests.operator import helpers as h


def _ctx(**spec: object) -> object:
    result = admission.admit(h.run(**spec), h.task())  # type: ignore[arg-type]
    assert not isinstance(result, admission.Rejection), result
    return result[0]


def test_only_the_runs_own_pods_and_the_scrapers_get_in() -> None:
    ctx = _ctx(workers=2)
    pol = netpol.network_policy(ctx, ("mlbench-system", "monitoring"))  # type: ignore[arg-type]
    spec = pol["spec"]
    own = {"mlbench.io/run": "r1", "app.kubernetes.io/managed-by": "mlbench-operator"}
    assert spec["podSelector"] == {"matchLabels": own}
    assert spec["policyTypes"] == ["Ingress"]  # egress open: DNS and peers
    peers, scrapers = spec["ingress"]
    assert peers == {"from": [{"podSelector": {"matchLabels": own}}]}  # any port: ssh, rendezvous, gloo
    assert "ports" not in peers
    (sel,) = scrapers["from"]
    assert sel["namespaceSelector"]["matchExpressions"][0]["values"] == ["mlbench-system", "monitoring"]
    assert "podSelector" not in sel
    assert scrapers["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert pol["metadata"]["ownerReferences"][0]["kind"] == "BenchmarkRun"


def test_every_rank_port_is_open_to_the_scrapers() -> None:
    ctx = _ctx(workers=2, slotsPerWorker=4)
    assert netpol.metrics_ports(ctx) == [{"protocol": "TCP", "port": 9400, "endPort": 9403}]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ("mlbench-system", "monitoring")),
        ({"POD_NAMESPACE": "ops"}, ("monitoring", "ops")),
        ({"MLBENCH_METRICS_NAMESPACES": "prom, grafana"}, ("grafana", "mlbench-system", "prom")),
        ({"MLBENCH_METRICS_NAMESPACES": ""}, ("mlbench-system",)),  # only the operator scrapes
    ],
)
def test_scraper_namespaces(env: dict[str, str], expected: tuple[str, ...]) -> None:
    assert settings.scraper_namespaces(env) == expected


def test_a_bad_namespace_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="MLBENCH_METRICS_NAMESPACES"):
        settings.scraper_namespaces({"MLBENCH_METRICS_NAMESPACES": "Not_A_Namespace"})
