"""The termination-message contract between launcher and operator."""

from __future__ import annotations

import json

import pytest

from mlbench_api.results import TERMINATION_MESSAGE_LIMIT, Environment, EpochRecord, PhaseTotals, RunSummary


def _summary(epochs: int = 164) -> RunSummary:
    return RunSummary(
        run="r",
        task="cifar10-resnet20",
        status="success",
        goal_reached=True,
        goal_target=0.8,
        time_to_goal_seconds=123.4,
        best_accuracy=0.812,
        final_accuracy=0.81,
        epochs=40,
        steps=62_500,
        samples=2_000_000,
        wall_clock_seconds=130.0,
        train_seconds=110.0,
        compute_seconds=90.0,
        communication_seconds=20.0,
        comm_compute_ratio=20 / 90,
        samples_per_second=15_384.6,
        phases=PhaseTotals(data=1, forward=30, backward=55, communication=20, optimizer=4, evaluation=8),
        environment=Environment(
            torch="2.15.0", devices=["NVIDIA H100 80GB HBM3"] * 64, world_size=64, backend="nccl", seed=1
        ),
        history=[EpochRecord(epoch=i, accuracy=0.5, loss=1.0, wall_seconds=float(i)) for i in range(epochs)],
    )


def test_termination_message_fits_the_kubelet_limit_and_round_trips() -> None:
    summary = _summary()
    text = summary.termination_message()
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    back = RunSummary.from_termination_message(text)
    assert back.time_to_goal_seconds == 123.4
    assert back.history == []  # per-epoch history stays in summary.json
    assert json.loads(text)["schema"] == "mlbench.io/summary/v1"


@pytest.mark.parametrize("text", ["", "not json", "{}", '{"run": "r"}', "[1, 2]"])
def test_malformed_termination_message_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - both JSON and schema errors are ValueErrors
        RunSummary.from_termination_message(text)
