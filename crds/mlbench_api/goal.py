"""A task's ``spec.goal``: the metric it compares, which way is better, and the target a run must reach."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from mlbench_api.common import (
    ApiModel,
    cel,
)


class GoalMode(StrEnum):
    TIME_TO_ACCURACY = "time-to-accuracy"  #: stop at the target; report the time
    ACCURACY_AFTER_TIME = "accuracy-after-time"  #: train for the budget; report accuracy


class GoalMetric(StrEnum):
    """What the goal measures after every epoch, on the whole test split."""

    TEST_TOP1_ACCURACY = "test-top1-accuracy"  #: fraction of correct predictions (multi-class)
    TEST_ACCURACY = "test-accuracy"  #: fraction of correct predictions (binary, task 2a)
    BLEU = "bleu"  #: corpus BLEU (0..100) of the decoded test set against its references (sacrebleu)
    PERPLEXITY = "perplexity"  #: exp of the mean per-token test loss; lower is better
    LOSS = "loss"  #: the mean test loss; lower is better


#: The metrics that are a fraction of correct predictions (shown as a percentage).
ACCURACY_METRICS = frozenset({GoalMetric.TEST_TOP1_ACCURACY, GoalMetric.TEST_ACCURACY})
#: The metrics whose goal is met at or below the target; all others at or above it.
LOWER_IS_BETTER = frozenset({GoalMetric.PERPLEXITY, GoalMetric.LOSS})
#: The largest target each bounded metric can reach.
METRIC_MAXIMUM = {GoalMetric.TEST_TOP1_ACCURACY: 1.0, GoalMetric.TEST_ACCURACY: 1.0, GoalMetric.BLEU: 100.0}


def known_metric(value: object) -> GoalMetric | None:
    """``value`` as a goal metric; None when it names none this API knows (absent, or from a newer version)."""
    return next((m for m in GoalMetric if m.value == value), None)


def comparator_of(metric: GoalMetric) -> Literal[">=", "<="]:
    """``<=`` for the metrics where lower is better (perplexity, loss), ``>=`` for the others."""
    return "<=" if metric in LOWER_IS_BETTER else ">="


def goal_met(metric: GoalMetric, value: float, target: float) -> bool:
    """Whether ``value`` of ``metric`` meets ``target`` (a NaN never does)."""
    return value <= target if metric in LOWER_IS_BETTER else value >= target


def better(metric: GoalMetric, values: list[float]) -> float:
    """The best of ``values`` for ``metric`` (the lowest where lower is better)."""
    return min(values) if metric in LOWER_IS_BETTER else max(values)


class Goal(ApiModel):
    """What counts as done: a metric of the test split compared with a target after every epoch."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.mode != 'accuracy-after-time' || has(self.timeBudgetSeconds)",
                    "accuracy-after-time needs timeBudgetSeconds",
                    ".timeBudgetSeconds",
                ),
                cel(
                    "!has(self.lightTarget) || (self.metric in ['perplexity', 'loss'] ? "
                    "self.lightTarget >= self.target : self.lightTarget <= self.target)",
                    "lightTarget must not be harder to reach than target",
                    ".lightTarget",
                ),
                cel(
                    "!has(self.comparator) || self.comparator == (self.metric in ['perplexity', 'loss'] ? '<=' : '>=')",
                    "comparator must be the metric's: <= for perplexity and loss, >= for the others",
                    ".comparator",
                ),
                cel(
                    "!(self.metric in ['test-top1-accuracy', 'test-accuracy']) || self.target <= 1.0",
                    "an accuracy target is a fraction in (0, 1]",
                    ".target",
                ),
                cel("self.metric != 'bleu' || self.target <= 100.0", "a BLEU target is at most 100", ".target"),
            ]
        }
    )

    metric: GoalMetric = GoalMetric.TEST_TOP1_ACCURACY
    """Evaluated on the whole test split after every epoch: test-top1-accuracy (default; multi-class) or
    test-accuracy (binary, task 2a) as fractions; bleu (0..100, sacrebleu on the detokenized test set); perplexity
    or loss (mean test loss; lower is better for both)."""
    comparator: Literal[">=", "<="] | None = None
    """How the metric is compared with the target; it follows from the metric (>= for accuracies and BLEU, <= for
    perplexity and loss). Unset: the metric's; set: must be the metric's."""
    target: Annotated[float, Field(gt=0)]
    """The value to reach, in the metric's units: accuracies as fractions in (0, 1] (0.8 = 80 %), BLEU in (0, 100];
    used by runs with goal full."""
    light_target: Annotated[float, Field(gt=0)] | None = None
    """A target for quick runs, not harder to reach than target (lower for accuracies and BLEU, higher for
    perplexity and loss); used by runs with goal light. Unset: light runs use target."""
    mode: GoalMode = GoalMode.TIME_TO_ACCURACY
    """time-to-accuracy (default): stop at the target and report the time; accuracy-after-time: train for
    timeBudgetSeconds and report the metric (whichever the goal's metric is)."""
    time_budget_seconds: Annotated[int, Field(ge=1, le=30 * 24 * 3600)] | None = None
    """accuracy-after-time (required there): seconds of training (at most 30 days); when spent, training stops after one
    last evaluation."""

    @model_validator(mode="after")
    def _rules(self) -> Goal:
        if self.mode is GoalMode.ACCURACY_AFTER_TIME and self.time_budget_seconds is None:
            raise ValueError("timeBudgetSeconds: accuracy-after-time needs timeBudgetSeconds")
        if self.comparator is not None and self.comparator != comparator_of(self.metric):
            raise ValueError(f"comparator: {self.metric.value} is met at {comparator_of(self.metric)} its target")
        maximum = METRIC_MAXIMUM.get(self.metric)
        for name, value in (("target", self.target), ("lightTarget", self.light_target)):
            if maximum is not None and value is not None and value > maximum:
                raise ValueError(f"{name}: a {self.metric.value} target is at most {maximum:g}")
        if self.light_target is not None and not goal_met(self.metric, self.target, self.light_target):
            raise ValueError("lightTarget: must not be harder to reach than target")
        return self

    def met(self, value: float, target: float | None = None) -> bool:
        """Whether ``value`` of the goal's metric meets ``target`` (default: the full target)."""
        return goal_met(self.metric, value, self.target if target is None else target)
