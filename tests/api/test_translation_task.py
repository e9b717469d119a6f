"""The translation task kind in the API: task 4b as the page gives it, the smoke task, and the kind's rules."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mlbench_api.catalog import get_task
from mlbench_api.config import resolve_schedule
from mlbench_api.dataspec import DatasetFormat
from mlbench_api.goal import GoalMetric
from mlbench_api.model import ModelName
from mlbench_api.schedule import Schedule
from mlbench_api.task import BenchmarkTaskSpec, Division


def test_task_4b_matches_the_page() -> None:
    s = get_task("wmt17-transformer").spec
    assert s.division is Division.CLOSED
    assert s.model.name is ModelName.TRANSFORMER
    assert s.model.transformer is None  # the base model
    assert (s.dataset.format, s.dataset.source) == (DatasetFormat.PARALLEL_TEXT, None)  # no checksum published
    assert s.dataset.volume == {"persistentVolumeClaim": {"claimName": "mlbench-datasets", "readOnly": True}}
    t = s.training
    assert t.optimizer.value == "adam"
    assert t.batch_size_per_worker == 8192
    assert t.learning_rate.schedule is Schedule.WARMUP_INVERSE_SQRT
    assert (t.learning_rate.value, t.learning_rate.warmup_steps) == (1.976e-3, 1000)
    assert t.max_epochs == 10
    x = t.translation
    assert x is not None
    assert x.tokens_per_step == 2**17
    assert (x.adam_betas, x.adam_eps, x.label_smoothing, x.precision) == ([0.9, 0.98], 1e-9, 0.1, "fp16")
    assert (x.loss_scaling.initial_scale, x.loss_scaling.factor, x.loss_scaling.window) == (2**7, 2, 2000)
    assert (x.max_length, x.beam, x.length_penalty, x.length_norm_const) == (80, 4, 0.6, 5.0)
    assert (s.goal.metric, s.goal.target, s.goal.light_target) == (GoalMetric.BLEU, 25.0, 20.0)
    assert [a.value for a in s.algorithms] == ["allreduce-sgd"]
    assert "no checksum" in s.description


def test_the_smoke_task_is_open_and_synthetic() -> None:
    s = get_task("synthetic-transformer-smoke").spec
    assert s.division is Division.OPEN
    assert s.dataset.format is DatasetFormat.SYNTHETIC
    assert "NOT WMT" in s.description
    assert s.goal.metric is GoalMetric.BLEU


def test_the_warmup_inverse_sqrt_schedule_resolves() -> None:
    lr = get_task("wmt17-transformer").spec.training.learning_rate
    resolved = resolve_schedule(lr, 8192, 4)
    assert (resolved.initial_lr, resolved.peak_lr, resolved.warmup_steps) == (0.0, 1.976e-3, 1000)


def smoke(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = get_task("synthetic-transformer-smoke").spec.to_api()
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
        (smoke(training__translation=None), "a translation task \\(transformer, gnmt\\) needs training.translation"),
        (
            smoke(training__optimizer="sgd"),
            "a translation task \\(transformer, gnmt\\) needs training.translation, optimizer adam",
        ),
        (smoke(goal__metric="test-top1-accuracy", goal__target=0.5, goal__lightTarget=0.4), "goal is bleu, perp"),
        (smoke(dataset__format="libsvm", dataset__path="/data/x"), "reads parallel-text or generates"),
    ],
)
def test_a_transformer_task_keeps_its_kinds_rules(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BenchmarkTaskSpec.model_validate(spec)


def test_other_models_refuse_the_translation_kinds_parts() -> None:
    base: dict[str, Any] = get_task("epsilon-logreg-synthetic").spec.to_api()
    bleu = {**base, "goal": {"metric": "bleu", "target": 20.0}}
    with pytest.raises(ValidationError, match="bleu goals are a translation task's"):
        BenchmarkTaskSpec.model_validate(bleu)
    sized = {**base, "model": {"name": "logistic-regression", "transformer": {"dModel": 64}}}
    with pytest.raises(ValidationError, match="transformer sizes are for a transformer model only"):
        BenchmarkTaskSpec.model_validate(sized)
    text = {**base, "dataset": {"name": "x", "format": "parallel-text", "path": "/data/x"}}
    with pytest.raises(ValidationError, match="the parallel-text format is a translation task's"):
        BenchmarkTaskSpec.model_validate(text)
    loss = {**base, "goal": {"metric": "loss", "target": 0.3}}
    assert BenchmarkTaskSpec.model_validate(loss).goal.metric is GoalMetric.LOSS


def test_transformer_sizes_need_heads_that_divide_the_width() -> None:
    spec = smoke(model__transformer={"dModel": 64, "heads": 5})
    with pytest.raises(ValidationError, match="dModel must divide by heads"):
        BenchmarkTaskSpec.model_validate(spec)


def test_task_4a_matches_the_page() -> None:
    s = get_task("wmt16-gnmt").spec
    assert s.division is Division.CLOSED
    assert s.model.name is ModelName.GNMT
    assert s.model.gnmt is None  # the reference's model
    assert (s.dataset.format, s.dataset.source, s.dataset.path) == (
        DatasetFormat.PARALLEL_TEXT,
        None,  # no checksum published: a volume the user provides
        "/data/wmt16_en_de",
    )
    t = s.training
    assert (t.optimizer.value, t.batch_size_per_worker, t.max_epochs) == ("adam", 128, 8)
    lr = t.learning_rate
    assert lr.schedule is Schedule.EXPONENTIAL_WARMUP_STEP_DECAY
    assert (lr.value, lr.warmup_steps, lr.decay_start, lr.decay_interval, lr.max_decays, lr.decay_factor) == (
        2e-3,
        200,
        0.4,
        0.05,
        4,
        0.5,
    )
    x = t.translation
    assert x is not None
    assert (x.sentences_per_step, x.adam_betas, x.adam_eps, x.label_smoothing) == (2048, [0.9, 0.999], 1e-8, 0.1)
    scaling = x.loss_scaling
    assert (scaling.initial_scale, scaling.factor, scaling.window, scaling.max_scale) == (2**10, 2, 128, 2**13)
    assert (x.max_length, x.test_max_length, x.clip_norm) == (75, 150, 5.0)
    assert (x.beam, x.length_penalty, x.length_norm_const, x.coverage_penalty) == (5, 0.6, 5.0, 0.1)
    assert (s.goal.metric, s.goal.target, s.goal.light_target) == (GoalMetric.BLEU, 24.0, 20.0)
    assert "no checksum" in s.description


def test_the_gnmt_smoke_task_is_open_and_synthetic() -> None:
    s = get_task("synthetic-gnmt-smoke").spec
    assert s.division is Division.OPEN
    assert s.model.name is ModelName.GNMT
    assert s.dataset.format is DatasetFormat.SYNTHETIC
    assert "NOT WMT" in s.description
    assert s.goal.metric is GoalMetric.BLEU


def test_the_4a_schedule_resolves_and_needs_its_numbers() -> None:
    lr = get_task("wmt16-gnmt").spec.training.learning_rate
    resolved = resolve_schedule(lr, 128, 4)
    assert (resolved.initial_lr, resolved.peak_lr, resolved.warmup_steps) == (2e-5, 2e-3, 200)
    spec = get_task("wmt16-gnmt").spec.to_api()
    spec["training"]["learningRate"].pop("warmupSteps")
    with pytest.raises(ValidationError, match="the exponential-warmup-step-decay schedule needs value and warmupSteps"):
        BenchmarkTaskSpec.model_validate(spec)


def gnmt(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = get_task("wmt16-gnmt").spec.to_api()
    for path, value in changes.items():
        section, _, field = path.partition("__")
        spec[section][field] = value
    return spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (gnmt(training__optimizer="sgd"), "a translation task \\(transformer, gnmt\\) needs"),
        (gnmt(goal__metric="test-top1-accuracy", goal__target=0.5, goal__lightTarget=0.4), "goal is bleu, perp"),
        (gnmt(model__name="transformer"), "coveragePenalty needs a model that reports its attention"),
        (gnmt(model__gnmt={"hidden": 64, "layers": 1}), "layers"),
        (smoke(model__gnmt={"hidden": 64}), "gnmt sizes are for a gnmt model only"),
    ],
)
def test_a_gnmt_task_keeps_its_kinds_rules(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BenchmarkTaskSpec.model_validate(spec)


def test_the_cel_rules_name_both_translation_models() -> None:
    """The CEL mirror of the kind's rules lists both models (what kubectl apply checks)."""
    rules = BenchmarkTaskSpec.model_json_schema()["x-kubernetes-validations"]
    translation = [r["rule"] for r in rules if "needs training.translation" in r["message"]]
    assert len(translation) == 1
    assert "['transformer', 'gnmt']" in translation[0]
    assert "'exponential-warmup-step-decay'" in translation[0]
