"""The Grafana dashboards query metrics that the runner and operator really export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

import mlbench_operator.metrics  # noqa: F401 - registers the operator's metrics on the default registry
from mlbench_runner.metrics import RunnerMetrics

GRAFANA = Path(__file__).resolve().parents[1] / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
METRIC = re.compile(r"\bmlbench_[a-z_]+\b")


#: Sample-name suffixes Prometheus exposes per metric type (labelled families have no
#: samples until a label set is used, so names come from the families, not the samples).
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}


def _sample_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
    return names


def _exported() -> set[str]:
    runner = RunnerMetrics("r", "t", "gloo", world_size=1, algorithm="allreduce-sgd", rank=0)
    return _sample_names(runner.registry) | _sample_names(REGISTRY)


def _targets(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for panel in dashboard["panels"] for t in panel.get("targets", [])]


def test_there_is_a_runner_and_an_operator_dashboard() -> None:
    assert {p.stem for p in DASHBOARDS} >= {"mlbench-runner", "mlbench-operator"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_every_query_names_exported_metrics(path: Path) -> None:
    exported = _exported()
    dashboard = json.loads(path.read_text())
    names = {name for t in _targets(dashboard) for name in METRIC.findall(t["expr"])}
    assert names, "a dashboard without mlbench queries"
    assert names - exported == set(), f"{path.name} queries metrics nobody exports"


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_dashboards_use_the_provisioned_datasource(path: Path) -> None:
    provisioned = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    dashboard = json.loads(path.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for target in _targets(dashboard):
        assert target["datasource"]["uid"] == uid
