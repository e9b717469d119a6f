"""The Grafana dashboards: what they query exists, and they work in kube-prometheus-stack.

Static checks only (no Grafana, no Prometheus): the metrics are really exported, every
panel uses the ``${datasource}`` variable, windows are ``$__rate_interval``, units fit
the metric, runner queries are filtered by namespace and run, and the sidecar ConfigMaps
(manifests/monitoring/dashboards.yaml) are fresh. tests/dashboard_queries.py expands the
queries for tests that run them against a real Prometheus.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

import mlbench_operator.metrics  # noqa: F401 - registers the operator's metrics on the default registry
from mlbench_runner.metrics import COLLECTIVE_METRIC_NAMES, METRIC_NAMES, CollectiveMetrics, LateGauge, RunnerMetrics
from tests.dashboard_queries import DASHBOARDS, GRAFANA, expand, panel_queries, panels

ROOT = GRAFANA.parent
RUNNER = GRAFANA / "dashboards" / "mlbench-runner.json"
OPERATOR = GRAFANA / "dashboards" / "mlbench-operator.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE_INTERVAL = "$__rate_interval"

#: Metrics the dashboards may use without MLBench exporting them: cAdvisor (kubelet) and
#: NVIDIA's DCGM exporter, as kube-prometheus-stack and the GPU operator scrape them.
EXTERNAL_METRICS = {
    "container_cpu_usage_seconds_total",
    "container_memory_working_set_bytes",
    "container_network_receive_bytes_total",
    "container_network_transmit_bytes_total",
    "DCGM_FI_DEV_GPU_UTIL",
}
#: Sample-name suffixes Prometheus exposes per metric type (labelled families have no
#: samples until a label set is used, so names come from the families, not the samples).
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool"}


def _sample_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
    return names


def _exported() -> set[str]:
    runner = RunnerMetrics("r", "t", "gloo", world_size=1, algorithm="allreduce-sgd", rank=0)
    for gauge in vars(runner).values():  # absent until first set: as a run has set them by its first evaluation
        if isinstance(gauge, LateGauge):
            gauge.set(1.0)
    collectives = CollectiveMetrics("r", "t", "gloo", world_size=2, rank=0)
    return _sample_names(runner.registry) | _sample_names(collectives.registry) | _sample_names(REGISTRY)


def _load(path: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    e = _strip_strings(expr)
    e = re.sub(r"\{[^}]*\}", "{}", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "[]", e)  # range windows
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # label lists
    return {
        m.group(1)
        for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", e)
        if not m.group(2) and m.group(1) not in PROMQL_KEYWORDS
    }


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, label matchers) of each vector selector, matchers '' when bare."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: m.group(0).replace("{", "\0").replace("}", "\1"), expr)
    found = []
    for name in metric_names(expr):
        for m in re.finditer(rf"(?<![\w:]){re.escape(name)}(?![\w:])(\s*\{{([^}}]*)\}})?", e):
            found.append((name, (m.group(2) or "").replace("\0", "{").replace("\1", "}")))
    return found


def _targets(path: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(panel, t) for panel in panels(_load(path)) for t in panel.get("targets", [])]


def _data_panels(path: Path) -> list[dict[str, Any]]:
    return [p for p in panels(_load(path)) if p["type"] != "row"]


by_dashboard = pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])


def test_there_is_a_runner_and_an_operator_dashboard() -> None:
    assert {p.stem for p in DASHBOARDS} >= {"mlbench-runner", "mlbench-operator"}
    assert (_load(RUNNER)["uid"], _load(RUNNER)["title"]) == ("mlbench-runner", "MLBench runner")
    assert (_load(OPERATOR)["uid"], _load(OPERATOR)["title"]) == ("mlbench-operator", "MLBench operator")


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (run, le) (rate(a_bucket{x="y{z}"}[$__rate_interval]))', {"a_bucket"}),
        ("histogram_quantile(0.5, b) / on (pod) group_left (run) c_total or d", {"b", "c_total", "d"}),
        ('max by (pod) (DCGM_FI_DEV_GPU_UTIL{pod=~"($run)-worker-[0-9]+"}) * 2', {"DCGM_FI_DEV_GPU_UTIL"}),
    ],
)
def test_metric_names_are_found(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@by_dashboard
def test_every_query_names_exported_metrics(path: Path) -> None:
    exported = _exported()
    names = {name for _, expr in panel_queries(path) for name in metric_names(expr)}
    assert any(n.startswith("mlbench_") for n in names), "a dashboard without mlbench queries"
    assert names - exported - EXTERNAL_METRICS == set(), f"{path.name} queries metrics nobody exports"


@by_dashboard
def test_dashboard_basics(path: Path) -> None:
    dashboard = _load(path)
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["editable"] is False, "provisioned dashboards are read-only (dashboard-linter)"
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(dashboard):
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, f"{panel['title']}: wider than the grid"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["title"], f"panel {panel['id']} needs a title"
            assert panel.get("description"), f"{panel['title']}: needs a description (dashboard-linter)"
            assert panel.get("targets"), f"{panel['title']}: no targets"


@by_dashboard
def test_every_panel_and_target_uses_the_datasource_variable(path: Path) -> None:
    dashboard = _load(path)
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert (variable["name"], variable["query"]) == ("datasource", "prometheus")
    assert variable["current"]["value"] == "default", "Grafana's default data source unless chosen"
    for panel in _data_panels(path):
        assert panel["datasource"] == DATASOURCE, panel["title"]
    for panel, target in _targets(path):
        assert target["datasource"] == DATASOURCE, f"{panel['title']} {target['refId']}"
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]
    assert "mlbench-prometheus" not in path.read_text(), "no datasource uid may be pinned"


@by_dashboard
def test_windows_are_the_rate_interval(path: Path) -> None:
    for title, expr in panel_queries(path):
        e = _strip_strings(expr)
        windows = re.findall(r"\[([^\]]*)\]", e)
        assert all(w == RATE_INTERVAL for w in windows), f"{title}: fixed window in {expr}"
        for fn in re.finditer(r"\b(rate|irate|increase)\s*\(", e):
            assert f"[{RATE_INTERVAL}]" in e[fn.end() :], f"{title}: {fn.group(1)} without a window"
        # counters and histogram buckets only through rate/increase (dashboard-linter's counter rule)
        for name, _ in selectors(expr):
            if name.endswith(("_total", "_bucket")):
                pattern = rf"\b(rate|irate|increase)\s*\(\s*{name}\s*(\{{[^}}]*\}})?\s*\[{re.escape(RATE_INTERVAL)}\]"
                assert re.search(pattern, expr), f"{title}: {name} not under rate/increase"


def _mapping_texts(panel: dict[str, Any]) -> dict[str, str]:
    return {
        value: option["text"]
        for mapping in panel["fieldConfig"]["defaults"].get("mappings", [])
        for value, option in mapping.get("options", {}).items()
    }


def _has_phase_mappings(panel: dict[str, Any]) -> bool:
    texts = _mapping_texts(panel)
    return sorted(texts.values()) == sorted(["Pending", "Starting", "Running", "Succeeded", "Failed"])


#: (what the panel's queries contain, units allowed, extra check): the first row that
#: matches a panel applies; a panel no row matches fails, so new panels need a rule.
UNIT_RULES: list[tuple[str, set[str | None], Callable[[dict[str, Any]], bool]]] = [
    ("mlbench_operator_run_status_phase", {None, "none"}, _has_phase_mappings),
    ("mlbench_collective_.*bandwidth_bytes_per_second", {"Bps", "binBps"}, lambda p: True),
    ("mlbench_collective_latency_seconds", {"s"}, lambda p: True),
    (r"uncompressed_bytes_per_step\{[^}]*\}\)\s*/", {"none"}, lambda p: "ratio" in p["title"].lower()),
    ("_bytes_per_step", {"bytes"}, lambda p: True),
    ("mlbench_goal_reached", {None, "none"}, lambda p: _mapping_texts(p) == {"0": "No", "1": "Yes"}),
    (r"histogram_quantile\(.*_seconds_bucket", {"s"}, lambda p: True),
    ("container_cpu_usage_seconds_total", {"none"}, lambda p: "cores" in p["title"]),
    ("mlbench_phase_seconds_total", {"percentunit", "none"}, lambda p: True),
    (r"_bytes_total", {"Bps", "binBps"}, lambda p: True),
    (r"_bytes\b", {"bytes"}, lambda p: True),
    ("mlbench_samples", {"short"}, lambda p: "samples/s" in p["title"]),
    ("mlbench_accuracy", {"percentunit"}, lambda p: p["fieldConfig"]["defaults"].get("max") == 1),
    ("mlbench_score", {"none"}, lambda p: "goal metric" in p["title"].lower()),
    ("DCGM_FI_DEV_GPU_UTIL", {"percent"}, lambda p: p["fieldConfig"]["defaults"].get("max") == 100),
    ("mlbench_operator_api_requests_total", {"reqps"}, lambda p: True),
    ("mlbench_operator_reconcile", {"ops"}, lambda p: True),
    (
        "mlbench_(epoch|loss|learning_rate|steps_total|operator_runs|operator_gang_restarts_total)",
        {"none", "short"},
        lambda p: True,
    ),
]


@by_dashboard
def test_units_fit_the_metric(path: Path) -> None:
    for panel in _data_panels(path):
        exprs = " ".join(t["expr"] for t in panel["targets"])
        rule = next((r for r in UNIT_RULES if re.search(r[0], exprs)), None)
        assert rule is not None, f"{panel['title']}: no unit rule for {exprs}"
        pattern, units, check = rule
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert unit in units, f"{panel['title']} ({pattern}): unit {unit!r}, want one of {units}"
        assert check(panel), f"{panel['title']} ({pattern}): title, range or value mappings"


@by_dashboard
def test_a_stacked_panel_stacks_one_runs_series_only(path: Path) -> None:
    """A stack reads as a whole (the phases of one run add up to its wall clock): a stacked panel keeps its series
    apart only by the label its legend shows (the stacked dimension) and by the variable it repeats over (one
    panel per run), else several runs or namespaces pile into one stack past 100%."""
    for panel in _data_panels(path):
        stacking = panel["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode", "none")
        if stacking == "none":
            continue
        for target in panel["targets"]:
            kept = {
                label.strip() for group in re.findall(r"by \(([^)]*)\)", target["expr"]) for label in group.split(",")
            }
            shown = set(re.findall(r"{{\s*(\w+)\s*}}", target.get("legendFormat", "")))
            assert len(shown) == 1, f"{panel['title']}: a stack's legend names its one stacked dimension"
            apart = kept - shown - {panel.get("repeat")}
            assert not apart, f"{panel['title']}: stacks series kept apart by {sorted(apart)} (repeat over them)"
            if panel.get("repeat"):
                assert f"${panel['repeat']}" in panel["title"], f"{panel['title']}: each repeat must say its value"


def _row_metrics(path: Path, row_title: str) -> set[str]:
    """The metric names the panels under a row (up to the next row) query."""
    names: set[str] = set()
    current = None
    for panel in panels(_load(path)):
        if panel["type"] == "row":
            current = panel["title"]
        elif current == row_title:
            names |= {n for t in panel["targets"] for n in metric_names(t["expr"])}
    return names


def test_runner_metrics_on_the_runner_dashboard_are_the_runners() -> None:
    """Every mlbench_ series the runner dashboard reads (operator series aside) is one the runner declares."""
    declared = set(METRIC_NAMES) | set(COLLECTIVE_METRIC_NAMES)
    suffixes = ("_bucket", "_sum", "_count")
    for title, expr in panel_queries(RUNNER):
        for name in metric_names(expr):
            if name.startswith("mlbench_") and not name.startswith("mlbench_operator_"):
                base = next((name.removesuffix(s) for s in suffixes if name.endswith(s)), name)
                assert base in declared, f"{title}: {name} is not in the runner's METRIC_NAMES"


def test_task_0a_has_a_collectives_row() -> None:
    """Bus bandwidth by operation and size, latency percentiles: every gauge a collectives task serves."""
    shown = _row_metrics(RUNNER, "Collectives (task 0a)")
    assert shown == set(COLLECTIVE_METRIC_NAMES) - {"mlbench_run_info", "mlbench_steps_total"}
    exprs = [t["expr"] for p in panels(_load(RUNNER)) if p["type"] != "row" for t in p["targets"]]
    for quantile in ("0.5", "0.9", "0.99"):
        assert any(f'quantile="{quantile}"' in e for e in exprs), f"no p{quantile} latency"
    assert any("by (namespace, run, op, bytes)" in e for e in exprs), "bandwidth by operation and size"


def test_the_algorithms_row_shows_bytes_and_compression() -> None:
    shown = _row_metrics(RUNNER, "Gradient communication (algorithms)")
    assert shown == {
        "mlbench_communication_bytes_per_step",
        "mlbench_communication_uncompressed_bytes_per_step",
        "mlbench_communication_bytes_total",
    }


def test_runner_queries_filter_on_namespace_and_run() -> None:
    pod = r'pod=~"($run)-worker-[0-9]+"'
    for title, expr in panel_queries(RUNNER):
        found = selectors(expr)
        assert found, f"{title}: no selector"
        for name, matchers in found:
            assert 'namespace=~"$namespace"' in matchers, f"{title}: {name} not filtered by namespace"
            if name.startswith("mlbench_"):
                assert 'run=~"$run"' in matchers, f"{title}: {name} not filtered by run"
            else:
                assert pod in matchers, f"{title}: {name} not filtered to the run's worker pods"
            if name.startswith("container_") and not name.startswith("container_network"):
                assert 'container="worker"' in matchers, f"{title}: {name} of other containers too"


def test_operator_pod_panels_use_the_operator_namespace() -> None:
    for title, expr in panel_queries(OPERATOR):
        for name, matchers in selectors(expr):
            if name in EXTERNAL_METRICS:
                assert 'namespace="$operator_namespace"' in matchers, f"{title}: {name}"
            if name == "mlbench_operator_run_status_phase":
                assert 'namespace=~"$namespace"' in matchers
                assert 'run=~"$run"' in matchers


def _variables(path: Path) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _load(path)["templating"]["list"]}


@pytest.mark.parametrize(
    ("path", "name", "query"),
    [
        (RUNNER, "namespace", "label_values(mlbench_run_info, namespace)"),
        (RUNNER, "run", 'label_values(mlbench_run_info{namespace=~"$namespace"}, run)'),
        (OPERATOR, "namespace", "label_values(mlbench_operator_run_status_phase, namespace)"),
        (OPERATOR, "run", 'label_values(mlbench_operator_run_status_phase{namespace=~"$namespace"}, run)'),
    ],
)
def test_query_variables(path: Path, name: str, query: str) -> None:
    variable = _variables(path)[name]
    assert (variable["type"], variable["query"]) == ("query", query)
    assert variable["refresh"] == 2, "reload the values when the time range changes"
    assert variable["multi"], "several values at once"
    assert variable["includeAll"], "an All value"


def test_variables_exist() -> None:
    assert set(_variables(RUNNER)) == {"datasource", "namespace", "run"}
    assert set(_variables(OPERATOR)) == {"datasource", "namespace", "run", "operator_namespace"}
    operator_ns = _variables(OPERATOR)["operator_namespace"]
    assert operator_ns["current"]["value"] == operator_ns["query"] == "mlbench-system"
    for path in DASHBOARDS:
        declared = set(_variables(path))
        for title, expr in panel_queries(path):
            used = {m.group(1) or m.group(2) for m in re.finditer(r"\$(\w+)|\$\{(\w+)", expr)}
            assert used - {"__rate_interval"} <= declared, f"{title}: undeclared variables"


@pytest.mark.parametrize(
    ("namespace", "run", "expected"),
    [
        ("ns", "r1", 'a{namespace=~"ns", run=~"r1", pod=~"(r1)-worker-[0-9]+", x="mlbench-system"}[1m]'),
        (
            ["ns"],
            ["r1", "r.2"],
            'a{namespace=~"ns", run=~"(r1|r\\\\.2)", pod=~"((r1|r\\\\.2))-worker-[0-9]+", x="mlbench-system"}[1m]',
        ),
    ],
)
def test_expand(namespace: str | list[str], run: str | list[str], expected: str) -> None:
    expr = 'a{namespace=~"$namespace", run=~"${run}", pod=~"($run)-worker-[0-9]+", x="$operator_namespace"}'
    assert expand(expr + "[$__rate_interval]", namespace, run) == expected
    with pytest.raises(ValueError, match="unknown variable"):
        expand("a{b=~'$nope'}", namespace, run)


@by_dashboard
def test_every_query_expands_fully(path: Path) -> None:
    queries = panel_queries(path)
    assert len(queries) >= 8
    for title, expr in queries:
        expanded = expand(expr, "default", "run-1")
        assert "$" not in _strip_strings(expanded).replace('""', ""), f"{title}: {expanded}"
        assert "[1m]" in expanded or not re.search(r"\b(rate|irate|increase)\s*\(", expanded), title


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("hack_dashboards", ROOT / "hack" / "dashboards.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dashboard_configmaps_are_fresh_and_labelled_for_the_sidecar() -> None:
    generator = _generator()
    path = ROOT / "manifests" / "monitoring" / "dashboards.yaml"
    assert path.read_text() == generator.render(), "stale: run `make dashboards`"
    assert generator.main(["--check"]) == 0
    configmaps = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert {c["metadata"]["name"] for c in configmaps} == {f"mlbench-dashboard-{p.stem}" for p in DASHBOARDS}
    for configmap in configmaps:
        assert configmap["kind"] == "ConfigMap"
        assert "namespace" not in configmap["metadata"], "kustomize sets the namespace"
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["annotations"]["grafana_folder"] == "MLBench"
        ((key, text),) = configmap["data"].items()
        assert text == (GRAFANA / "dashboards" / key).read_text()


def test_stale_configmaps_are_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generator = _generator()
    stale = tmp_path / "dashboards.yaml"
    stale.write_text(generator.render().replace('"MLBench runner"', '"old title"'))
    monkeypatch.setattr(generator, "OUTPUT", stale)
    monkeypatch.setattr(generator, "ROOT", tmp_path)
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0


def test_provisioned_datasource_url_is_a_plain_variable() -> None:
    text = (GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    assert ":-" not in text, "Grafana expands $VAR and ${VAR} only, no shell defaults"
    (datasource,) = yaml.safe_load(text)["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "${MLBENCH_PROMETHEUS_URL}"
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "mlbench.yaml").read_text())
    assert provider["providers"][0]["options"]["path"]
    assert provider["providers"][0]["folder"] == "MLBench"
