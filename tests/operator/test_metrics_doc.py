"""Every metric the operator exports is in docs/operator.md's metric list, with its labels: the list is where
users look for what to query (the dashboards and alerts are checked against the code in tests/test_grafana.py
and tests/monitoring)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from mlbench_operator import metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"


def _documented() -> str:
    text = DOC.read_text()
    start = text.index("### Metrics (port 8080)")
    end = text.index("\n## ", start)
    return text[start:end]


def test_every_operator_metric_is_documented_with_its_labels() -> None:
    section = _documented()
    exported = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(exported) >= 10
    for metric in exported:
        name = metric._name + ("_total" if metric._type == "counter" else "")
        labels = ",".join(metric._labelnames)
        shown = f"`{name}{{{labels}}}`" if labels else f"`{name}`"
        assert shown in section, f"docs/operator.md's metric list lacks {shown}"
    names = set(re.findall(r"`(mlbench_operator_[a-z_]+)", section))
    assert names <= {m._name + ("_total" if m._type == "counter" else "") for m in exported}, "a metric gone"
