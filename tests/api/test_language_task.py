"""The language-modelling task kind in the API: task 3a as the page gives it, the smoke task, and the kind's rules."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mlbench_api.catalog import get_task
from mlbench_api.dataspec import DatasetFormat
from mlbench_api.goal import GoalMetric
from mlbench_api.model import ModelName
from mlbench_api.schedule import Schedule
from mlbench_api.task import BenchmarkTaskSpec, Division


def test_task_3a_matches_the_page_and_the_paper() -> None:
    s = get_task("wikitext2-awd-lstm").spec
    assert s.division is Division.CLOSED
    assert s.model.name is ModelName.AWD_LSTM
    assert s.model.awd_lstm is None  # the reference's WikiText-2 model
    assert (s.dataset.format, s.dataset.source) == (DatasetFormat.WIKITEXT_TOKENS, None)  # no checksum published
    assert s.dataset.volume == {"persistentVolumeClaim": {"claimName": "mlbench-datasets", "readOnly": True}}
    t = s.training
    assert (t.optimizer.value, t.batch_size_per_worker, t.weight_decay, t.max_epochs) == ("sgd", 80, 1.2e-6, 750)
    assert (t.learning_rate.schedule, t.learning_rate.value) == (Schedule.CONSTANT, 30.0)
    x = t.language_model
    assert x is not None
    assert (x.bptt, x.random_length, x.short_probability, x.length_std, x.min_length) == (70, True, 0.05, 5.0, 5)
    assert (x.warmup_epochs_per_worker, x.clip_norm, x.ar_alpha, x.tar_beta, x.nonmono) == (3, 0.25, 2.0, 1.0, 5)
    assert (x.eval_batch_size, x.evaluate_on) == (10, "valid")
    assert (s.goal.metric, s.goal.target, s.goal.light_target) == (GoalMetric.PERPLEXITY, 68.6, 70.0)
    assert [a.value for a in s.algorithms] == ["allreduce-sgd"]
    assert "no checksum" in s.description


def test_the_smoke_task_is_open_and_synthetic() -> None:
    s = get_task("synthetic-awd-lstm-smoke").spec
    assert s.division is Division.OPEN
    assert s.dataset.format is DatasetFormat.SYNTHETIC
    assert "NOT WikiText-2" in s.description
    assert (s.goal.metric, s.goal.comparator) == (GoalMetric.PERPLEXITY, None)


def smoke(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = get_task("synthetic-awd-lstm-smoke").spec.to_api()
    for path, value in changes.items():
        section, _, field = path.partition("__")
        if value is None:
            spec[section].pop(field)
        else:
            spec[section][field] = value
    return spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (smoke(training__languageModel=None), "needs training.languageModel and optimizer sgd"),
        (smoke(training__optimizer="adam"), "needs training.languageModel and optimizer sgd"),
        (
            smoke(training__learningRate={"schedule": "multistep", "perSample": 0.1}),
            "learningRate is constant",
        ),
        (smoke(dataset__format="libsvm", dataset__path="/data/x"), "reads wikitext-tokens or generates"),
        (smoke(goal__metric="bleu", goal__lightTarget=None), "bleu goals are a translation task's"),
        (smoke(training__translation={}), "are a translation task's"),
    ],
)
def test_an_awd_lstm_task_keeps_its_kinds_rules(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BenchmarkTaskSpec.model_validate(spec)


def test_other_models_refuse_the_language_kinds_parts() -> None:
    base: dict[str, Any] = get_task("epsilon-logreg-synthetic").spec.to_api()
    tokens = {**base, "dataset": {"name": "x", "format": "wikitext-tokens", "path": "/data/x"}}
    with pytest.raises(ValidationError, match="the wikitext-tokens format are an awd-lstm task's"):
        BenchmarkTaskSpec.model_validate(tokens)
    section = {**base, "training": {**base["training"], "languageModel": {}}}
    with pytest.raises(ValidationError, match=r"training\.languageModel and the wikitext-tokens format"):
        BenchmarkTaskSpec.model_validate(section)
    sized = {**base, "model": {"name": "logistic-regression", "awdLstm": {"layers": 2}}}
    with pytest.raises(ValidationError, match="awdLstm sizes are for an awd-lstm model only"):
        BenchmarkTaskSpec.model_validate(sized)
    perplexity = {**base, "goal": {"metric": "perplexity", "target": 50.0}}
    with pytest.raises(ValidationError, match="perplexity goals a translation or awd-lstm task's"):
        BenchmarkTaskSpec.model_validate(perplexity)
    transformer: dict[str, Any] = get_task("synthetic-transformer-smoke").spec.to_api()
    both = {**transformer, "training": {**transformer["training"], "languageModel": {}}}
    with pytest.raises(ValidationError, match=r"training\.languageModel and the wikitext-tokens format"):
        BenchmarkTaskSpec.model_validate(both)


def test_an_awd_lstm_loss_goal_is_allowed() -> None:
    spec = smoke(goal__metric="loss", goal__target=2.0, goal__lightTarget=None)
    assert BenchmarkTaskSpec.model_validate(spec).goal.metric is GoalMetric.LOSS
