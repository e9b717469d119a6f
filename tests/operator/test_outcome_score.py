"""A finished run's status in its task's metric: ``status.result``'s scores and the SCORE column's string."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mlbench_api.goal import GoalMetric
from mlbench_api.results import CommunicationRecord, RunSummary
from mlbench_api.runstatus import Progress, RunResult
from mlbench_operator.run import outcome
from tests import factories

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0"


def _translated(metric: str | None = "bleu", final: float | None = 24.31) -> RunSummary:
    return factories.summary().model_copy(
        update={
            "goal_metric": metric,
            "best_score": 24.9 if final is not None else None,
            "final_score": final,
            "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0"
            if metric == "bleu"
            else None,
            "final_accuracy": None,
            "best_accuracy": None,
        }
    )


@pytest.mark.parametrize(
    ("metric", "final", "score"),
    [
        ("bleu", 24.31, "24.3 BLEU"),
        ("perplexity", 71.25, "ppl 71.2"),
        ("test-top1-accuracy", 0.812, "81.2%"),
        (None, None, None),  # an older runner's summary: no metric, no score
        ("top5", 0.9, None),  # a metric this operator does not know: the figure is kept, no string made up
    ],
)
def test_the_final_progress_shows_the_tasks_metric(metric: str | None, final: float | None, score: str | None) -> None:
    progress = outcome.final_progress(Progress(epoch=1.0, last_accuracy=0.1), _translated(metric, final), NOW)
    assert progress.score == score
    assert progress.last_score == (final if score is not None else None)
    assert progress.last_accuracy == 0.1  # a translation run's summary has no accuracy: the old one stays


def test_the_result_keeps_the_scores_and_how_bleu_was_computed() -> None:
    summary = _translated()
    result = outcome.summary_result(summary)
    assert RunResult.model_validate(result.model_dump(by_alias=True)) == result  # what the status patch carries
    assert result.goal_metric is GoalMetric.BLEU
    assert (result.best_score, result.final_score) == (24.9, 24.31)
    assert result.bleu_signature == summary.bleu_signature


def test_the_columns_read_at_a_glance_and_the_exact_figures_stay() -> None:
    """EPOCH and COMPRESSION (kubectl get br -o wide) are strings a person reads; the numbers stay exact."""
    sent = CommunicationRecord(bytes_per_step=1000, compression_ratio=71.93456)
    summary = factories.summary(epochs=7.96875, communication=sent)
    progress = outcome.final_progress(None, summary, NOW)
    assert (progress.epoch, progress.epoch_rounded) == (7.96875, "7.9")  # cut, never an epoch not yet done
    result = outcome.summary_result(summary)
    assert (result.compression_ratio, result.compression) == (71.93456, "71.9x")
