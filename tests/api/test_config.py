"""How a run's effective configuration is formed from task + overrides + worker count."""

from __future__ import annotations

from typing import Any

import pytest

from mlbench_api.catalog import get_task, parse_run
from mlbench_api.config import InvalidOverride, OverrideNotAllowed, RunConfig, effective_config
from mlbench_api.task import BenchmarkTaskSpec


def _run(task: str, workers: int = 1, slots: int = 1, **spec: Any) -> Any:
    doc = {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkRun",
        "metadata": {"name": "r", "namespace": "ns"},
        "spec": {"taskRef": {"name": task}, "workers": workers, "slotsPerWorker": slots, **spec},
    }
    return parse_run(doc)


def _config(task: str, **kwargs: Any) -> RunConfig:
    run = _run(task, **kwargs)
    return effective_config(run, task, get_task(task).spec)


@pytest.mark.parametrize(("workers", "slots"), [(1, 1), (2, 1), (4, 1), (2, 4), (32, 1)])
def test_1a_linear_scaling_from_eta_b_to_eta_b_k(workers: int, slots: int) -> None:
    cfg = _config("cifar10-resnet20", workers=workers, slots=slots)
    k = workers * slots
    assert cfg.world_size == k
    assert cfg.lr.initial_lr == pytest.approx(0.1 / 256 * 32)
    assert cfg.lr.peak_lr == pytest.approx(0.1 / 256 * 32 * k)
    assert cfg.lr.warmup_epochs == 5
    assert cfg.lr.milestones == [82, 109]


@pytest.mark.parametrize(
    ("workers", "alpha"), [(1, 200), (2, 400), (3, 400), (4, 600), (7, 600), (8, 700), (16, 800), (64, 800)]
)
def test_2a_alpha_table_by_worker_count(workers: int, alpha: float) -> None:
    cfg = _config("epsilon-logreg", workers=workers)
    assert cfg.lr.alpha == alpha
    assert cfg.lr.schedule.value == "inverse-sqrt"


def test_goal_selection_light_uses_light_target() -> None:
    assert _config("cifar10-resnet20").goal_target == 0.80
    assert _config("cifar10-resnet20", goal="light").goal_target == 0.70


def test_closed_division_refuses_unlisted_override_naming_it() -> None:
    with pytest.raises(OverrideNotAllowed, match=r"spec\.overrides: maxEpochs, momentum may not be overridden"):
        _config("cifar10-resnet20", overrides={"momentum": 0.5, "maxEpochs": 3})


def test_closed_division_applies_listed_override() -> None:
    cfg = _config("cifar10-resnet20", overrides={"model": {"name": "resnet", "version": "m2", "depth": 56}})
    assert (cfg.task.model.version, cfg.task.model.depth) == ("m2", 56)
    assert get_task("cifar10-resnet20").spec.model.depth == 20  # the catalog is not mutated


def test_closed_division_model_override_picks_a_variant_not_another_model() -> None:
    """Task 1a lists model as overridable for ResNet's m1/m2 and depth; logistic regression is not 1a."""
    with pytest.raises(OverrideNotAllowed, match=r"spec\.overrides\.model\.name: .* variant of the task's resnet"):
        _config("cifar10-resnet20", overrides={"model": {"name": "logistic-regression"}})


def test_open_division_accepts_any_override() -> None:
    cfg = _config(
        "cifar10-resnet20-smoke", workers=2, overrides={"maxEpochs": 7, "learningRate": 0.01, "trainSubset": 100}
    )
    assert cfg.task.training.max_epochs == 7
    assert cfg.task.dataset.train_subset == 100
    assert cfg.lr.peak_lr == pytest.approx(0.01 * 32 * 2)


@pytest.mark.parametrize(
    ("task", "rate", "ok"), [("epsilon-logreg-synthetic", 400.0, True), ("cifar10-resnet20-smoke", 40.0, False)]
)
def test_a_learning_rate_override_is_bounded_by_its_schedule(task: str, rate: float, ok: bool) -> None:
    """2a's alpha is 200 to 800 (the spec tunes it over 0.001 to 1000): an override must reach it; a multistep
    per-sample rate stays at most 10, refused by the task's own rule with the field named."""
    if ok:
        assert _config(task, overrides={"learningRate": rate}).lr.alpha == rate
    else:
        with pytest.raises(InvalidOverride, match=r"perSample"):
            _config(task, overrides={"learningRate": rate})


def test_override_that_breaks_a_cross_field_rule_is_refused() -> None:
    with pytest.raises(InvalidOverride, match=r"spec\.overrides: .*training\.learningRate\.milestones"):
        _config("cifar10-resnet20-smoke", overrides={"maxEpochs": 2})


def test_config_round_trips_through_json(tmp_path: Any) -> None:
    cfg = _config("epsilon-logreg-synthetic", workers=2, seed=3)
    path = tmp_path / "config.json"
    path.write_text(cfg.dump())
    again = RunConfig.load(path)
    assert again == cfg
    assert isinstance(again.task, BenchmarkTaskSpec)
    assert again.seed == 3
