"""The goal's metric from one evaluation: which number the target is compared with.

Accuracy and loss come from every task kind's evaluation; perplexity is exp of the mean per-token test loss;
BLEU needs decoding, which only a translation task kind does (its own evaluation reports it).
"""

from __future__ import annotations

import math

from mlbench_api.goal import GoalMetric

#: exp() of a loss past this overflows a float; such a model's perplexity is reported as infinite.
MAX_EXPONENT = 700.0


def perplexity(mean_token_loss: float) -> float:
    """exp(loss) of a mean per-token cross-entropy in nats; inf past exp's range, NaN stays NaN."""
    if math.isnan(mean_token_loss):
        return math.nan
    return math.exp(mean_token_loss) if mean_token_loss <= MAX_EXPONENT else math.inf


def epoch_score(metric: GoalMetric, accuracy: float, loss: float, bleu: float | None = None) -> float:
    """The value of ``metric`` after an evaluation that measured ``accuracy``, mean ``loss`` and maybe ``bleu``."""
    if metric in (GoalMetric.TEST_TOP1_ACCURACY, GoalMetric.TEST_ACCURACY):
        return accuracy
    if metric is GoalMetric.LOSS:
        return loss
    if metric is GoalMetric.PERPLEXITY:
        return perplexity(loss)
    if bleu is None:
        raise ValueError("goal.metric: bleu needs a task kind that decodes its test set (translation)")
    return bleu
