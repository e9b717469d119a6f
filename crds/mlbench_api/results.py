"""The result contract between runner, launcher and operator.

Rank 0 writes a full :class:`RunSummary` to ``<output>/summary.json``; the launcher
writes :meth:`RunSummary.termination_message` (compact, < 4 KiB, the kubelet's limit)
to ``/dev/termination-log``; the operator parses it back with
:meth:`RunSummary.from_termination_message` into ``status.result``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final, Literal

from pydantic import Field, ValidationError

from mlbench_api.common import ApiModel, Finite, SafeInt
from mlbench_api.errors import InvalidObject, format_errors

TERMINATION_MESSAGE_LIMIT = 4096
SUMMARY_SCHEMA: Final = "mlbench.io/summary/v1"

StopReason = Literal["goal", "max-epochs", "time-budget", "max-steps", "diverged", "error", "setup-failed"]


class PhaseTotals(ApiModel):
    """Seconds per training phase, summed over steps on rank 0 (see the runner docs)."""

    data: Finite = 0.0
    forward: Finite = 0.0
    backward: Finite = 0.0
    communication: Finite = 0.0
    optimizer: Finite = 0.0
    evaluation: Finite = 0.0


class Environment(ApiModel):
    torch: str | None = None
    cuda: str | None = None
    devices: Annotated[list[str], Field(max_length=64)] = Field(default_factory=list)
    world_size: SafeInt
    backend: str
    algorithm: str | None = None
    seed: SafeInt | None = None
    hostname: str | None = None
    precision: str | None = Field(default=None, description="fp32, fp64 or bf16-autocast.")
    channels_last: bool | None = None


class EpochRecord(ApiModel):
    epoch: SafeInt
    accuracy: Finite | None = None
    loss: Finite | None = None
    wall_seconds: Finite
    lr: Finite | None = None


class RunSummary(ApiModel):
    """The outcome of one run, as rank 0 saw it."""

    schema_: Literal["mlbench.io/summary/v1"] = Field(default=SUMMARY_SCHEMA, alias="schema")
    run: str
    task: str
    status: Literal["success", "goal-not-reached", "aborted"]
    stop_reason: StopReason | None = Field(default=None, description="Why training stopped.")
    goal_reached: bool
    goal_target: Finite | None = None
    time_to_goal_seconds: Finite | None = Field(default=None, description="Wall clock from run start to the goal.")
    best_accuracy: Finite | None = None
    final_accuracy: Finite | None = None
    epochs: Finite
    steps: SafeInt
    samples: SafeInt
    wall_clock_seconds: Finite = Field(description="Run start (before data is touched) to run stop.")
    train_seconds: Finite = Field(description="Sum of per-step times (data+forward+backward+comm+optimizer).")
    compute_seconds: Finite
    communication_seconds: Finite
    comm_compute_ratio: Finite | None = None
    samples_per_second: Finite
    phases: PhaseTotals
    environment: Environment
    history: list[EpochRecord] = Field(default_factory=list)

    def termination_message(self) -> str:
        """Compact JSON that fits the kubelet's 4 KiB termination-message limit."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        data.pop("history", None)
        text = json.dumps(data, separators=(",", ":"))
        if len(text.encode()) > TERMINATION_MESSAGE_LIMIT:
            data["environment"].pop("devices", None)
            text = json.dumps(data, separators=(",", ":"))
        return text

    @classmethod
    def from_termination_message(cls, text: str) -> RunSummary:
        """Parse a launcher's termination message; raises ValueError when malformed.

        A value the API server could not store in ``status.result`` (NaN, Infinity or an overflow
        to it such as ``1e400``, an integer beyond 2^53) is malformed too: the error names the field.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:  # JSONDecodeError, or an integer with more digits than Python converts
            raise ValueError(f"termination message is not JSON: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InvalidObject("termination message", format_errors(exc)) from exc
