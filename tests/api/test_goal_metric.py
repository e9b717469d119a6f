"""The goal's metric: accuracies, BLEU, perplexity and loss, each with its direction and range."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mlbench_api.goal import Goal, GoalMetric, better, comparator_of, goal_met


@pytest.mark.parametrize(
    ("metric", "value", "target", "met"),
    [
        (GoalMetric.TEST_TOP1_ACCURACY, 0.8, 0.8, True),
        (GoalMetric.TEST_ACCURACY, 0.79, 0.8, False),
        (GoalMetric.BLEU, 25.0, 25.0, True),
        (GoalMetric.BLEU, 24.9, 25.0, False),
        (GoalMetric.PERPLEXITY, 4.0, 4.5, True),
        (GoalMetric.PERPLEXITY, 5.0, 4.5, False),
        (GoalMetric.LOSS, 0.3, 0.3, True),
        (GoalMetric.LOSS, 0.31, 0.3, False),
        (GoalMetric.LOSS, float("nan"), 0.3, False),
        (GoalMetric.BLEU, float("nan"), 1.0, False),
    ],
)
def test_goal_met_follows_the_metrics_direction(metric: GoalMetric, value: float, target: float, met: bool) -> None:
    assert goal_met(metric, value, target) is met
    assert Goal(metric=metric, target=target).met(value) is met


def test_lower_is_better_only_for_perplexity_and_loss() -> None:
    assert [m for m in GoalMetric if comparator_of(m) == "<="] == [GoalMetric.PERPLEXITY, GoalMetric.LOSS]
    assert better(GoalMetric.PERPLEXITY, [5.0, 3.0, 4.0]) == 3.0
    assert better(GoalMetric.BLEU, [5.0, 30.0, 4.0]) == 30.0


def test_defaults_stay_the_accuracy_goal() -> None:
    goal = Goal(target=0.8)
    assert goal.metric is GoalMetric.TEST_TOP1_ACCURACY
    assert goal.to_api()["metric"] == "test-top1-accuracy"


@pytest.mark.parametrize(
    ("goal", "message"),
    [
        ({"metric": "test-top1-accuracy", "target": 1.5}, "target: a test-top1-accuracy target is at most 1"),
        ({"metric": "bleu", "target": 101}, "target: a bleu target is at most 100"),
        ({"metric": "bleu", "target": 25, "lightTarget": 30}, "lightTarget: must not be harder"),
        ({"metric": "perplexity", "target": 4.5, "lightTarget": 4.0}, "lightTarget: must not be harder"),
        ({"metric": "loss", "target": 0.3, "comparator": ">="}, "comparator: loss is met at <="),
        ({"metric": "bleu", "target": 25, "comparator": "<="}, "comparator: bleu is met at >="),
    ],
)
def test_invalid_goals_are_refused(goal: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Goal.model_validate(goal)


@pytest.mark.parametrize(
    "goal",
    [
        {"metric": "bleu", "target": 25.0, "lightTarget": 20.0, "comparator": ">="},
        {"metric": "perplexity", "target": 4.5, "lightTarget": 6.0, "comparator": "<="},
        {"metric": "loss", "target": 0.3, "mode": "accuracy-after-time", "timeBudgetSeconds": 60},
        {"metric": "test-accuracy", "target": 0.89, "comparator": ">="},
    ],
)
def test_valid_goals_round_trip(goal: dict[str, object]) -> None:
    assert Goal.model_validate(goal).to_api() == Goal.model_validate(Goal.model_validate(goal).to_api()).to_api()
