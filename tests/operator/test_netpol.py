"""The run's NetworkPolicy: who may reach its pods and whom they reach (pure builder; test_cluster_lifecycle has the
API server accept it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlbench_operator import egress, netpol, settings
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
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    peers, scrapers = spec["ingress"]
    assert peers == {"from": [{"podSelector": {"matchLabels": own}}]}  # any port: ssh, rendezvous, gloo
    assert "ports" not in peers
    (sel,) = scrapers["from"]
    assert sel["namespaceSelector"]["matchExpressions"][0]["values"] == ["mlbench-system", "monitoring"]
    assert "podSelector" not in sel
    assert scrapers["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert pol["metadata"]["ownerReferences"][0]["kind"] == "BenchmarkRun"


def test_a_runs_pods_reach_only_each_other_and_dns() -> None:
    """No other tenant's pods, no API server, no cloud metadata service (169.254.169.254): no rule allows them."""
    pol = netpol.network_policy(_ctx(workers=2), ("monitoring",), ("10.213.0.1/32",))  # type: ignore[arg-type]
    own = {"mlbench.io/run": "r1", "app.kubernetes.io/managed-by": "mlbench-operator"}
    peers, dns = pol["spec"]["egress"]
    assert peers == {"to": [{"podSelector": {"matchLabels": own}}]}  # any port: ssh, rendezvous, gloo; no ipBlock
    assert dns == {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    assert "Egress" in pol["spec"]["policyTypes"]  # without it the egress rules would be ignored


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


DNS = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


@pytest.mark.parametrize(
    ("blocks", "rules"),
    [
        # unset: every address but the link-local metadata blocks, and DNS anywhere
        (
            None,
            [
                {
                    "to": [
                        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}},
                        {"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128"]}},
                    ]
                },
                DNS,
            ],
        ),
        # listed: those blocks on any port, and DNS anywhere
        (
            ("10.213.1.0/24", "fd00::/8"),
            [
                {
                    "to": [
                        {"ipBlock": {"cidr": "10.213.1.0/24"}},
                        {"ipBlock": {"cidr": "fd00::/8", "except": ["fd00:ec2::254/128"]}},
                    ]
                },
                DNS,
            ],
        ),
        # a wide block the admin lists still leaves the metadata service out
        (
            ("128.0.0.0/1", "160.0.0.0/3"),
            [
                {
                    "to": [
                        {"ipBlock": {"cidr": "128.0.0.0/1", "except": ["169.254.0.0/16"]}},
                        {"ipBlock": {"cidr": "160.0.0.0/3", "except": ["169.254.0.0/16"]}},
                    ]
                },
                DNS,
            ],
        ),
    ],
)
def test_a_fetch_job_is_reached_by_nobody_and_reaches_what_the_admin_lists(
    blocks: tuple[str, ...] | None, rules: list[object]
) -> None:
    pol = netpol.fetch_network_policy("mlbench-fetch-cifar10-abc", "ns", "cifar10", blocks)
    assert pol["metadata"]["name"] == "mlbench-fetch-cifar10-abc"
    assert pol["metadata"]["namespace"] == "ns"
    assert "ownerReferences" not in pol["metadata"]  # made before its Job; lives with the namespace
    spec = pol["spec"]
    assert spec["podSelector"] == {"matchLabels": {"batch.kubernetes.io/job-name": "mlbench-fetch-cifar10-abc"}}
    assert spec["ingress"] == []
    assert spec["policyTypes"] == ["Ingress", "Egress"]  # egress is never left open
    assert spec["egress"] == rules


@pytest.mark.parametrize(
    ("cidr", "excepted", "within"),
    [
        ("0.0.0.0/0", ["169.254.0.0/16"], None),
        ("169.0.0.0/8", ["169.254.0.0/16"], None),
        ("10.0.0.0/8", None, None),
        ("::/0", ["fd00:ec2::254/128"], None),
        ("fd00:ec2::/32", ["fd00:ec2::254/128"], None),
        ("2001:db8::/32", None, None),
        ("169.254.0.0/16", None, "169.254.0.0/16"),  # the block itself: no exception can carve it out
        ("169.254.169.254/32", None, "169.254.0.0/16"),
        ("fd00:ec2::254/128", None, "fd00:ec2::254/128"),
    ],
)
def test_metadata_blocks_are_excepted_or_named(cidr: str, excepted: list[str] | None, within: str | None) -> None:
    assert egress.ip_block(cidr)["ipBlock"].get("except") == excepted
    assert egress.metadata_overlap(cidr) == within


@pytest.mark.parametrize("raw", ["169.254.169.254", "10.0.0.0/8,169.254.0.0/16", "fd00:ec2::254"])
def test_a_fetch_egress_block_within_the_metadata_addresses_is_refused(raw: str) -> None:
    with pytest.raises(SettingsError, match=r"MLBENCH_FETCH_EGRESS_CIDRS: .* lies within .*metadata"):
        settings.DatasetSettings.from_env({"MLBENCH_FETCH_EGRESS_CIDRS": raw})


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


OPERATOR_MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "operator"


def test_the_operators_namespace_admits_only_the_scrapers_on_the_metrics_port() -> None:
    """manifests/operator: every pod of mlbench-system isolated for ingress; the metrics port (the Deployment's)
    open to the monitoring namespace only (the kubelet's health probes come from the node and always pass)."""
    kustomization = yaml.safe_load((OPERATOR_MANIFESTS / "kustomization.yaml").read_text())
    assert "networkpolicy.yaml" in kustomization["resources"]
    (pol,) = yaml.safe_load_all((OPERATOR_MANIFESTS / "networkpolicy.yaml").read_text())
    deployment = next(
        d for d in yaml.safe_load_all((OPERATOR_MANIFESTS / "deployment.yaml").read_text()) if d["kind"] == "Deployment"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    metrics = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    assert pol["kind"] == "NetworkPolicy"
    assert pol["metadata"]["namespace"] == deployment["metadata"]["namespace"] == settings.DEFAULT_OPERATOR_NAMESPACE
    assert pol["spec"]["podSelector"] == {}  # the whole namespace
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = pol["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": metrics}]
    (peer,) = rule["from"]
    (expr,) = peer["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == netpol.NAMESPACE_NAME_LABEL
    scrapers = set(settings.scraper_namespaces({})) - {settings.DEFAULT_OPERATOR_NAMESPACE}
    assert set(expr["values"]) == scrapers  # the runs' default scrapers: the monitoring stack
    assert "podSelector" not in peer
