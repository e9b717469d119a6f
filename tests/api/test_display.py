"""The figures ``kubectl get br`` shows: rounded strings next to the exact values."""

from __future__ import annotations

import math

import pytest

from mlbench_api.crdgen import KINDS
from mlbench_api.display import duration, epoch, percent, ratio, score
from mlbench_api.goal import GoalMetric
from mlbench_api.runstatus import Progress, RunResult


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


@pytest.mark.parametrize(
    ("metric", "value", "shown", "as_target"),
    [
        (GoalMetric.TEST_TOP1_ACCURACY, 0.8123456, "81.2%", "81%"),
        (GoalMetric.TEST_ACCURACY, 0.89, "89.0%", "89%"),
        (GoalMetric.BLEU, 24.3456, "24.3 BLEU", "24.3456 BLEU"),
        (GoalMetric.BLEU, 25.0, "25.0 BLEU", "25 BLEU"),
        (GoalMetric.PERPLEXITY, 71.234, "ppl 71.2", "ppl 71.234"),
        (GoalMetric.PERPLEXITY, 3.2e12, "ppl 3.2e+12", "ppl 3.2e+12"),
        (GoalMetric.LOSS, 0.41234, "loss 0.412", "loss 0.41234"),
        (GoalMetric.LOSS, 12.3456, "loss 12.3", "loss 12.3456"),
    ],
)
def test_a_score_is_written_in_its_metrics_form(metric: GoalMetric, value: float, shown: str, as_target: str) -> None:
    assert score(metric, value) == shown
    assert score(metric, value, target=True) == as_target


@pytest.mark.parametrize("metric", list(GoalMetric))
def test_the_largest_score_fits_the_status_column(metric: GoalMetric) -> None:
    """status.progress.score holds at most 24 characters: the largest storable value of every metric fits."""
    value = 1.0 if metric.value.endswith("accuracy") else 1.7976931348623157e308
    Progress(score=score(metric, value))


def test_run_columns_show_the_formatted_strings() -> None:
    run = next(spec for spec in KINDS if spec.kind == "BenchmarkRun")
    columns = {c["name"]: c for c in run.printer_columns}
    assert columns["Score"] == {**columns["Score"], "jsonPath": ".status.progress.score", "type": "string"}
    ttg = columns["Time-To-Goal"]
    assert ttg == {**ttg, "jsonPath": ".status.result.timeToGoal", "type": "string"}


@pytest.mark.parametrize(
    ("epochs", "shown"),
    [(0, "0"), (2.34666, "2.3"), (2.96, "2.9"), (0.7, "0.7"), (8.0, "8"), (12345.67, "12345.6"), (3.2e12, "3.2e+12")],
)
def test_epoch_is_cut_to_tenths(epochs: float, shown: str) -> None:
    assert epoch(epochs) == shown


@pytest.mark.parametrize(("value", "shown"), [(71.93456, "71.9x"), (1.0, "1.0x"), (0.5, "0.5x"), (2e300, "2e+300x")])
def test_ratio_has_one_decimal(value: float, shown: str) -> None:
    assert ratio(value) == shown


def test_the_largest_figures_fit_their_status_strings() -> None:
    largest = 1.7976931348623157e308
    Progress(epoch_rounded=epoch(largest))
    RunResult(goal_reached=True, compression=ratio(largest))


def test_no_run_column_prints_a_raw_float() -> None:
    """A ``number`` column prints every digit (6.497854486000506): each figure a run computes is shown as a string."""
    run = next(spec for spec in KINDS if spec.kind == "BenchmarkRun")
    assert [c["name"] for c in run.printer_columns if c["type"] == "number"] == []
