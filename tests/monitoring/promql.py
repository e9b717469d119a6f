"""Evaluate PromQL over given series with ``promtool test rules`` (a real PromQL engine, no server)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.monitoring.test_rules import promtool

#: One expression, the time to evaluate it at, and the samples it must return: ``{"labels": "{...}", "value": v}``.
Case = tuple[str, str, list[dict[str, Any]]]


def evaluate(tmp_path: Path, series: dict[str, str], cases: list[Case]) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on ``cases`` over ``series`` (series -> promtool's expanding notation, one a minute)."""
    test: dict[str, Any] = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": [{"expr": e, "eval_time": t, "exp_samples": exp} for e, t, exp in cases],
            }
        ],
    }
    (tmp_path / "promql_test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run(
        [promtool(), "test", "rules", "promql_test.yaml"], check=False, cwd=tmp_path, capture_output=True, text=True
    )
