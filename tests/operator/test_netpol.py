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


def test_scrapers_outside_any_namespace_get_in_by_address_on_the_metrics_ports_only() -> None:
    """A Prometheus on a host (the test cluster's) or in another cluster is in no namespace a selector can name."""
    ctx = _ctx(workers=2)
    pol = netpol.network_policy(ctx, ("monitoring",), ("10.213.0.1/32", "192.168.0.0/16"))  # type: ignore[arg-type]
    peers, scrapers = pol["spec"]["ingress"]
    assert scrapers["from"][1:] == [{"ipBlock": {"cidr": "10.213.0.1/32"}}, {"ipBlock": {"cidr": "192.168.0.0/16"}}]
    assert scrapers["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert all("ipBlock" not in peer for peer in peers["from"])  # never on the run's own ports


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ()),
        ("", ()),
        ("10.213.0.1/32, 192.168.0.0/16", ("10.213.0.1/32", "192.168.0.0/16")),
        ("10.0.0.7", ("10.0.0.7/32",)),
        ("fd00::/8", ("fd00::/8",)),
    ],
)
def test_scraper_cidrs(raw: str | None, expected: tuple[str, ...]) -> None:
    env = {} if raw is None else {"MLBENCH_METRICS_CIDRS": raw}
    assert settings.scraper_cidrs(env) == expected


@pytest.mark.parametrize("raw", ["10.0.0.1/33", "10.0.0.1/24", "prometheus.local"])
def test_a_bad_address_block_names_the_variable(raw: str) -> None:
    """``10.0.0.1/24`` has host bits set: almost always a typo for ``10.0.0.0/24`` or ``/32``."""
    with pytest.raises(SettingsError, match="MLBENCH_METRICS_CIDRS"):
        settings.scraper_cidrs({"MLBENCH_METRICS_CIDRS": raw})


@pytest.mark.parametrize(
    ("egress", "types", "rules"),
    [
        # unset: nothing gets in, egress open (the object has no egress rules and no Egress type)
        (None, ["Ingress"], None),
        # listed: those blocks on any port, and DNS anywhere
        (
            ("10.213.1.0/24", "fd00::/8"),
            ["Ingress", "Egress"],
            [
                {"to": [{"ipBlock": {"cidr": "10.213.1.0/24"}}, {"ipBlock": {"cidr": "fd00::/8"}}]},
                {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
            ],
        ),
    ],
)
def test_a_fetch_job_is_reached_by_nobody_and_reaches_what_the_admin_lists(
    egress: tuple[str, ...] | None, types: list[str], rules: list[object] | None
) -> None:
    pol = netpol.fetch_network_policy("mlbench-fetch-cifar10-abc", "ns", "cifar10", egress)
    assert pol["metadata"]["name"] == "mlbench-fetch-cifar10-abc"
    assert pol["metadata"]["namespace"] == "ns"
    assert "ownerReferences" not in pol["metadata"]  # made before its Job; lives with the namespace
    spec = pol["spec"]
    assert spec["podSelector"] == {"matchLabels": {"batch.kubernetes.io/job-name": "mlbench-fetch-cifar10-abc"}}
    assert spec["ingress"] == []
    assert spec["policyTypes"] == types
    assert spec.get("egress") == rules


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, None), ("", None), (" 10.213.1.0/24 ,10.213.2.0/24", ("10.213.1.0/24", "10.213.2.0/24"))],
)
def test_fetch_egress_cidrs(raw: str | None, expected: tuple[str, ...] | None) -> None:
    env = {} if raw is None else {"MLBENCH_FETCH_EGRESS_CIDRS": raw}
    assert settings.DatasetSettings.from_env(env).egress_cidrs == expected


def test_a_bad_fetch_egress_block_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="MLBENCH_FETCH_EGRESS_CIDRS"):
        settings.DatasetSettings.from_env({"MLBENCH_FETCH_EGRESS_CIDRS": "10.213.1.1/24"})
