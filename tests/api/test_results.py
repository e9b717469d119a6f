"""The termination-message contract between launcher and operator."""

from __future__ import annotations

import json

import pytest

from mlbench_api.results import (
    TERMINATION_MESSAGE_LIMIT,
    CommunicationRecord,
    Environment,
    EpochRecord,
    PhaseTotals,
    RunSummary,
)
from tests.factories import summary


def _summary(epochs: int = 164) -> RunSummary:
    return summary(
        run_name="r",
        task="cifar10-resnet20",
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


@pytest.mark.parametrize(
    ("reason", "kept"),
    [
        pytest.param("CUDA graph capture failed, eager instead: RuntimeError: short", True, id="short: kept whole"),
        pytest.param("CUDA graph capture failed, eager instead: " + "x" * 5000, False, id="a long CUDA error: cut"),
    ],
)
def test_a_long_fallback_reason_does_not_push_the_message_past_the_limit(reason: str, kept: bool) -> None:
    """The kubelet keeps a longer message's last 4096 bytes: JSON without its start, a successful run failed as
    InvalidResult. Free text is cut before anything the status needs."""
    summary = _summary()
    summary.environment.training_step_reason = reason
    text = summary.termination_message()
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    back = RunSummary.from_termination_message(text)
    assert (back.time_to_goal_seconds, back.goal_reached, back.status) == (123.4, True, "success")
    shown = back.environment.training_step_reason
    assert shown == reason if kept else (shown is not None and shown.endswith("...") and len(shown) <= 240)


@pytest.mark.parametrize("char", ["h", "\u00e9", "\U0001f600"])
def test_long_texts_go_before_what_the_status_reads(char: str) -> None:
    """status.result reads the figures, ``communication`` and ``peakBusBandwidth``: they stay, while free texts
    are cut by their size as JSON (a non-ASCII character is 6 to 12 bytes there)."""
    summary = _summary()
    summary.environment.hostname = char * 3000
    summary.environment.training_step_reason = char * 3000
    summary.environment.torch = char * 3000
    summary.peak_bus_bandwidth = {"all-reduce": 1.5e10, "broadcast": 2e10}
    summary.communication = CommunicationRecord(
        collectives=["all-reduce"], bytes_per_step=1_088_040, compression_ratio=1
    )
    text = summary.termination_message()
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    back = RunSummary.from_termination_message(text)
    assert back.samples_per_second == pytest.approx(15_384.6)
    assert back.peak_bus_bandwidth == {"all-reduce": 1.5e10, "broadcast": 2e10}
    assert back.communication is not None
    assert back.communication.bytes_per_step == 1_088_040
    assert (back.environment.world_size, back.environment.backend, back.environment.seed) == (64, "nccl", 1)
