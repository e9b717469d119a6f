"""The figures ``kubectl get br`` shows: rounded strings next to the exact values."""

from __future__ import annotations

import math

import pytest

from mlbench_api.crdgen import KINDS
from mlbench_api.display import duration, percent


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (6.497854486000506, "6.5s"),
        (0, "0.0s"),
        (-0.2, "0.0s"),
        (59.94, "59.9s"),
        (59.96, "1m00s"),
        (247.4, "4m07s"),
        (3600, "1h00m00s"),
        (7389.6, "2h03m10s"),
    ],
)
def test_duration_rounds_for_a_glance(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_duration_refuses_what_is_not_a_time(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        duration(bad)


@pytest.mark.parametrize(("fraction", "shown"), [(0.8123456, "81.2%"), (0.0, "0.0%"), (0.9996, "100.0%")])
def test_percent_has_one_decimal(fraction: float, shown: str) -> None:
    assert percent(fraction) == shown


def test_run_columns_show_the_formatted_strings() -> None:
    run = next(spec for spec in KINDS if spec.kind == "BenchmarkRun")
    columns = {c["name"]: c for c in run.printer_columns}
    assert columns["Accuracy"] == {**columns["Accuracy"], "jsonPath": ".status.progress.accuracy", "type": "string"}
    ttg = columns["Time-To-Goal"]
    assert ttg == {**ttg, "jsonPath": ".status.result.timeToGoal", "type": "string"}
