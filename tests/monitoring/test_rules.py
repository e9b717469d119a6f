"""The PrometheusRule's alerts: valid for promtool, and they fire (only) when they should.

``promtool test rules`` runs tests/monitoring/rules_test.yaml against the rule groups of
manifests/monitoring/prometheusrule.yaml; wrong variants of the rules (mutants) must fail the same cases,
so the cases are shown to be able to fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULE = REPO / "manifests" / "monitoring" / "prometheusrule.yaml"
CASES = Path(__file__).with_name("rules_test.yaml")
DOCS = REPO / "docs" / "monitoring.md"
RUNBOOKS = REPO / "manifests" / "monitoring" / "runbooks.yaml"
ALERTS = {
    "MLBenchOperatorDown",
    "MLBenchOperatorNoLeader",
    "MLBenchNamespaceUnavailable",
    "MLBenchReconcileErrors",
    "MLBenchGangRestarts",
    "MLBenchRunStalled",
    "MLBenchWorkerUnreachable",
    "MLBenchRunFailed",
}
Obj = dict[str, Any]
_LABEL_REF = re.compile(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def runbook_base() -> str:
    """The one setting every alert's runbook_url starts with (kustomization.yaml's replacement copies it)."""
    base: str = yaml.safe_load(RUNBOOKS.read_text())["data"]["base"]
    return base


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.skip("promtool not installed (Debian: prometheus; `make system-deps`)")
    return found


def rule_groups() -> list[Obj]:
    rule = yaml.safe_load(RULE.read_text())
    assert rule["kind"] == "PrometheusRule"
    groups: list[Obj] = rule["spec"]["groups"]
    return groups


def alerts(groups: list[Obj]) -> dict[str, Obj]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def render(template: str, labels: dict[str, str]) -> str:
    """``{{ $labels.x }}`` as Go's template renders it; any other template action is refused (keep them simple)."""

    def label(m: re.Match[str]) -> str:
        assert m.group(1) in labels, f"annotation uses $labels.{m.group(1)}, which the alert does not carry: {labels}"
        return labels[m.group(1)]

    out = _LABEL_REF.sub(label, template)
    assert "{{" not in out, f"unsupported template action in {template!r}"
    return out


def with_annotations(cases: Obj, groups: list[Obj]) -> Obj:
    """rules_test.yaml with every expected alert's exp_annotations rendered from its rule and labels."""
    rules = alerts(groups)
    for test in cases["tests"]:
        for check in test.get("alert_rule_test") or []:
            annotations = rules[check["alertname"]]["annotations"]
            for exp in check.get("exp_alerts") or []:
                labels = {k: str(v) for k, v in exp["exp_labels"].items()}
                exp["exp_annotations"] = {k: render(v, labels) for k, v in annotations.items()}
    return cases


def run_promtool_test(tmp_path: Path, groups: list[Obj]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "mlbench-rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    cases = with_annotations(yaml.safe_load(CASES.read_text()), groups)
    (tmp_path / "rules_test.yaml").write_text(yaml.safe_dump(cases, sort_keys=False))
    return subprocess.run(
        [promtool(), "test", "rules", "rules_test.yaml"],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.multiproc
def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    path = tmp_path / "mlbench-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    res = subprocess.run(
        [promtool(), "check", "rules", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in res.stdout


def test_every_alert_is_labelled_documented_and_tested() -> None:
    rules = alerts(rule_groups())
    assert set(rules) == ALERTS
    docs = DOCS.read_text()
    tested = {
        check["alertname"]
        for test in yaml.safe_load(CASES.read_text())["tests"]
        for check in test["alert_rule_test"]
        if check.get("exp_alerts")
    }
    assert tested == ALERTS, "every alert needs a case where it fires"
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        url, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert (url, anchor) == (runbook_base(), name.lower()), f"{name}: runbook_url is <runbooks.yaml base>#<anchor>"
        assert anchor in github_anchors(docs), f"docs/monitoring.md has no section (anchor #{anchor}) for {name}"


@pytest.mark.parametrize(
    ("markdown", "anchor"),
    [
        ("### MLBenchRunFailed\n", "mlbenchrunfailed"),
        ("## Install with kube-prometheus-stack", "install-with-kube-prometheus-stack"),
    ],
)
def test_github_anchors(markdown: str, anchor: str) -> None:
    assert anchor in github_anchors(markdown)
    assert anchor not in github_anchors(markdown.replace("#", "").replace("Failed", "Failing"))


def test_the_runbook_base_points_at_the_rendered_doc() -> None:
    assert re.fullmatch(r"https://github\.com/[^/]+/mlbench/blob/[^/]+/docs/monitoring\.md", runbook_base())


@pytest.mark.multiproc
def test_alerts_fire_when_they_should(tmp_path: Path) -> None:
    res = run_promtool_test(tmp_path, rule_groups())
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def _mutate(groups: list[Obj], alert: str, old: str, new: str) -> list[Obj]:
    out = yaml.safe_load(yaml.safe_dump(groups))
    rule = alerts(out)[alert]
    assert old in rule["expr"], f"mutant of {alert} does not apply: {old!r} not in its expr"
    rule["expr"] = rule["expr"].replace(old, new)
    return out


_PHASE = 'mlbench_operator_run_status_phase{job="mlbench-operator-metrics", phase="Running"}'
#: MLBenchRunStalled's "Running for 10 minutes": merged over the operator's replicas, then the minimum; the
#: other order sees a new leader's fresh series as Running all along.
_MERGED_THEN_MIN = f"min_over_time(\n    (max by (namespace, run) (\n      {_PHASE}\n    ))[10m:1m]\n  )"
_MIN_THEN_MERGED = f"max by (namespace, run) (min_over_time({_PHASE}[10m]))"


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("alert", "old", "new", "why"),
    [
        ("MLBenchRunStalled", "unless on (namespace, run)", "unless on (run)", "another namespace's run masks a stall"),
        ("MLBenchRunStalled", "min_over_time(", "max_over_time(", "no grace after a run starts Running"),
        ("MLBenchRunStalled", "increase(mlbench_steps_total", "-increase(mlbench_steps_total", "never clears"),
        ("MLBenchRunStalled", "serves_metrics{", "serves_metrics_x{", "a task's own program is judged by steps"),
        ("MLBenchRunStalled", _MERGED_THEN_MIN, _MIN_THEN_MERGED, "a leader change cuts the 10 minutes short"),
        ("MLBenchWorkerUnreachable", "and on (namespace, run)", "or on (namespace, run)", "fires outside Running"),
        ("MLBenchOperatorDown", "== 0", "== 1", "a healthy operator alerts"),
        ("MLBenchNamespaceUnavailable", "== 0", "== 1", "a served namespace alerts"),
        ("MLBenchNamespaceUnavailable", "max by (namespace, job)", "max by (job)", "which namespace is lost"),
        ("MLBenchReconcileErrors", "[5m]", "[30m]", "a single error alerts"),
        ("MLBenchRunFailed", 'phase="Failed"', 'phase="Succeeded"', "the wrong phase"),
    ],
)
def test_wrong_rules_fail_the_cases(tmp_path: Path, alert: str, old: str, new: str, why: str) -> None:
    res = run_promtool_test(tmp_path, _mutate(rule_groups(), alert, old, new))
    assert res.returncode != 0, f"the cases accept a wrong {alert} ({why}):\n{res.stdout}"
    assert alert in res.stdout + res.stderr
