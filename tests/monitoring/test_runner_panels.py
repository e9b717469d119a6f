"""The runner dashboard's collectives and compression panels, evaluated by promtool over a run's series.

Each panel's queries are expanded as Grafana sends them and must return this run's values only: bandwidth per
(operation, size), each latency panel target its own quantile, the compression ratio as uncompressed over sent
bytes (a run that sends nothing has no ratio), and not the series of another run in the namespace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_queries import GRAFANA, expand, panel_queries
from tests.monitoring.promql import evaluate

RUNNER = GRAFANA / "dashboards" / "mlbench-runner.json"
RUN = 'namespace="ns",run="r"'
OTHER = 'namespace="ns",run="r2"'
SERIES = {
    **{
        f'mlbench_collective_bus_bandwidth_bytes_per_second{{{RUN},op="{op}",bytes="{size}"}}': f"{value}x10"
        for op, size, value in [("all-reduce", 64, 5), ("all-reduce", 1024, 50), ("broadcast", 64, 7)]
    },
    f'mlbench_collective_bus_bandwidth_bytes_per_second{{{OTHER},op="all-reduce",bytes="64"}}': "999x10",
    f'mlbench_collective_algorithm_bandwidth_bytes_per_second{{{RUN},op="all-reduce",bytes="64"}}': "4x10",
    **{
        f'mlbench_collective_latency_seconds{{{RUN},op="all-reduce",bytes="64",quantile="{q}"}}': f"{v}x10"
        for q, v in [("0.5", 0.1), ("0.9", 0.2), ("0.99", 0.3)]
    },
    # two ranks of a compressed algorithm (4x), one of a run that sends nothing (one rank: no ratio)
    **{f'mlbench_communication_bytes_per_step{{{RUN},rank="{r}"}}': "100x10" for r in "01"},
    **{f'mlbench_communication_uncompressed_bytes_per_step{{{RUN},rank="{r}"}}': "400x10" for r in "01"},
    f'mlbench_communication_bytes_per_step{{{OTHER},rank="0"}}': "0x10",
    f'mlbench_communication_uncompressed_bytes_per_step{{{OTHER},rank="0"}}': "400x10",
    f'mlbench_communication_bytes_total{{{RUN},rank="0"}}': "0+600x10",
}


def sample(value: float, **labels: str) -> dict[str, Any]:
    return {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}", "value": value}


def queries(title: str) -> list[str]:
    found = [expr for t, expr in panel_queries(RUNNER) if t == title]
    assert found, f"no panel {title!r}"
    return found


def cases() -> list[tuple[str, list[list[dict[str, Any]]]]]:
    """(panel, its queries expanded for run r, the samples each must return at 5m)."""
    ns = {"namespace": "ns", "run": "r"}
    bus = [
        sample(5, op="all-reduce", bytes="64", **ns),
        sample(50, op="all-reduce", bytes="1024", **ns),
        sample(7, op="broadcast", bytes="64", **ns),
    ]
    table_bus = [{**s, "labels": s["labels"].replace('namespace="ns",', "")} for s in bus]
    latency = [[sample(v, op="all-reduce", bytes="64", **ns)] for v in (0.1, 0.2, 0.3)]
    return [
        ("Bus bandwidth by operation and size", [bus]),
        (
            "Bus and algorithm bandwidth by size (last sweep)",
            [table_bus, [sample(4, op="all-reduce", bytes="64", run="r")]],
        ),
        ("Collective latency (p50, p90, p99) by operation and size", latency),
        ("Compression ratio", [[sample(4, **ns)]]),
        ("Payload bytes per step (per rank)", [[sample(100, **ns)], [sample(400, **ns)]]),
        ("Payload sent per second (per rank)", [[sample(10, rank="0", **ns)]]),
    ]


@pytest.mark.multiproc
@pytest.mark.parametrize(("title", "expected"), cases(), ids=[c[0] for c in cases()])
def test_panel_returns_the_runs_values(tmp_path: Path, title: str, expected: list[list[dict[str, Any]]]) -> None:
    exprs = [expand(e, "ns", "r") for e in queries(title)]
    assert len(exprs) == len(expected), f"{title}: {len(exprs)} queries"
    res = evaluate(tmp_path, SERIES, [(e, "5m", exp) for e, exp in zip(exprs, expected, strict=True)])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.multiproc
def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The harness can fail: the ratio upside down is refused."""
    (expr,) = queries("Compression ratio")
    res = evaluate(tmp_path, SERIES, [(expand(expr, "ns", "r"), "5m", [sample(0.25, namespace="ns", run="r")])])
    assert res.returncode != 0
    assert 'got: {namespace="ns", run="r"} 4E+00' in res.stdout + res.stderr, "failed for another reason"
