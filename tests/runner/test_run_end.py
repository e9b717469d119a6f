"""How a run ends: the status and stop reason its summary and rank record carry, however it stopped."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from mlbench_api.results import RunSummary
from mlbench_runner.options import Options
from mlbench_runner.rank.train import Trainer
from mlbench_runner.world import World

from .helpers import logreg_task, make_config

SINGLE = World(0, 1, 0, 1, "127.0.0.1", 0, "single")


class Boom(RuntimeError):
    pass


def _raise(*_args: object, **_kwargs: object) -> None:
    raise Boom("injected")


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("broken", "ended", "summary_written"),
    [
        (None, ("goal-not-reached", "max-epochs"), True),  # stopped on its own: its own reason
        ("_end_epoch", ("aborted", "error"), True),  # raised after set-up: the summary says "error"
        ("_setup", ("aborted", "setup-failed"), False),  # raised in set-up: no summary, the record says so
    ],
)
def test_the_stop_reason_names_how_the_run_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str | None, ended: tuple[str, str], summary_written: bool
) -> None:
    """Status and stop reason (summary, ``run_stop`` event, rank record) for each way a run can end."""
    out = tmp_path / "out"
    config = make_config(logreg_task(batch=10, epochs=2, train=100, features=8), out, 1)
    if broken is not None:
        monkeypatch.setattr(Trainer, broken, _raise)
    trainer = Trainer(config, SINGLE, Options())
    if broken is None:
        trainer.run()
    else:
        with pytest.raises(Boom):
            trainer.run()

    assert json.loads((out / "ranks" / "rank-0.json").read_text())["stop_reason"] == ended[1]
    stops = [e for e in map(json.loads, (out / "events.jsonl").read_text().splitlines()) if e["event"] == "run_stop"]
    assert [(e["status"], e["stop_reason"]) for e in stops] == [ended]
    assert (out / "summary.json").exists() is summary_written
    if summary_written:
        summary = RunSummary.model_validate_json((out / "summary.json").read_text())
        assert (summary.status, summary.stop_reason) == ended


def _kept_metrics(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every RunnerMetrics the trainer makes from now on, in order (to read their registries afterwards)."""
    from mlbench_runner.rank import setup

    registries: list[setup.RunnerMetrics] = []
    made = setup.RunnerMetrics

    def keep(*args: object, **kwargs: object) -> setup.RunnerMetrics:
        registries.append(made(*args, **kwargs))  # type: ignore[arg-type]
        return registries[-1]

    monkeypatch.setattr(setup, "RunnerMetrics", keep)
    return registries


@pytest.mark.multiproc
def test_the_goal_gauge_follows_the_last_evaluation_and_accuracy_is_absent_until_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accuracy-after-time: the target crossed after epoch 1 and lost by the end is not reached, and the
    gauge says so at the end as the summary does (it stayed 1). Before the first evaluation the page has
    no accuracy, loss or throughput sample at all (a 0 read as an accuracy in ``kubectl get``)."""

    task = logreg_task(batch=10, epochs=3, train=100, features=8)
    task["goal"] = {"target": 0.6, "metric": "test-accuracy", "mode": "accuracy-after-time", "timeBudgetSeconds": 600}
    config = make_config(task, tmp_path / "out", 1)
    registries = _kept_metrics(monkeypatch)
    accuracies, seen = iter([0.9, 0.3, 0.4]), []

    def evaluate(self: Trainer, s: object) -> tuple[float, float]:
        registry = registries[0].registry
        names = ("mlbench_accuracy", "mlbench_score", "mlbench_goal_reached")
        seen.append([registry.get_sample_value(m) for m in names])
        return next(accuracies), 0.5

    monkeypatch.setattr(Trainer, "_evaluate", evaluate)
    Trainer(config, SINGLE, Options()).run()
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    assert not summary.goal_reached
    assert seen == [[None, None, 0.0], [0.9, 0.9, 1.0], [0.3, 0.3, 0.0]]
    assert registries[0].registry.get_sample_value("mlbench_goal_reached") == 0.0

    # reached after epoch 1, diverged in epoch 2 (a non-finite loss): aborted, and the gauge says 0 too
    registries.clear()
    accuracies, seen = iter([0.9, 0.9]), []
    losses = iter([0.5, float("nan")])
    real_train_epoch = Trainer._train_epoch

    def train_epoch(self: Trainer, s: Any, epoch: int, step: int) -> Any:
        return dataclasses.replace(real_train_epoch(self, s, epoch, step), mean_loss=next(losses))

    monkeypatch.setattr(Trainer, "_train_epoch", train_epoch)
    Trainer(make_config(task, tmp_path / "again", 1), SINGLE, Options()).run()
    summary = RunSummary.model_validate_json((tmp_path / "again" / "summary.json").read_text())
    assert (summary.status, summary.stop_reason) == ("aborted", "diverged")
    assert registries[0].registry.get_sample_value("mlbench_goal_reached") == 0.0


@pytest.mark.multiproc
@pytest.mark.parametrize("phase_timing", [True, False])
def test_steps_are_counted_with_the_phase_timer_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase_timing: bool
) -> None:
    """``MLBENCH_PHASE_TIMING=0`` drops the phase times, not the steps: ``mlbench_steps_total`` (the operator's
    progress and stall detection) still counts every step; the step histogram and the summary's phase means
    get nothing rather than zero-second steps."""

    config = make_config(logreg_task(batch=10, epochs=2, train=100, features=8), tmp_path / "out", 1)
    registries = _kept_metrics(monkeypatch)
    Trainer(config, SINGLE, Options(phase_timing=phase_timing)).run()
    registry = registries[0].registry
    assert registry.get_sample_value("mlbench_steps_total") == 20  # 2 epochs of 100 samples in batches of 10
    assert registry.get_sample_value("mlbench_samples_total") == 200
    timed_steps = registry.get_sample_value("mlbench_step_duration_seconds_count")
    assert timed_steps == (20 if phase_timing else 0)
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    assert (summary.samples_per_second > 0) is phase_timing
