"""A task's ``spec.training.learningRate``: the learning-rate schedules and how the rate scales with the workers."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from mlbench_api.common import (
    ApiModel,
    cel,
)


class Schedule(StrEnum):
    MULTI_STEP = "multistep"  #: per-sample rate, linear-scaling warm-up, step decays
    INVERSE_SQRT = "inverse-sqrt"  #: alpha / sqrt(t), alpha chosen by worker count
    CONSTANT = "constant"
    WARMUP_INVERSE_SQRT = "warmup-inverse-sqrt"  #: linear from 0 to value over warmupSteps, then value*sqrt(w/t)
    #: value * 0.01**((w - t) / w) up to warmupSteps, then halvings from decayStart of the total steps (task 4a)
    EXPONENTIAL_WARMUP_STEP_DECAY = "exponential-warmup-step-decay"


#: The schedules of the translation tasks (4b's, 4a's); the other models take neither.
TRANSLATION_SCHEDULES = (Schedule.WARMUP_INVERSE_SQRT, Schedule.EXPONENTIAL_WARMUP_STEP_DECAY)


class AlphaForWorkers(ApiModel):
    """Row of the 2a alpha table: applies from ``minWorkers`` workers up."""

    min_workers: Annotated[int, Field(ge=1, le=1024)]
    """Smallest world size (total processes) this row applies to."""
    alpha: Annotated[float, Field(gt=0)]
    """The alpha of alpha/sqrt(t) for that world size and up to the next row."""


class LearningRate(ApiModel):
    """The learning-rate rule. Rates are per sample so they scale with the batch."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.schedule != 'multistep' || has(self.perSample)",
                    "the multistep schedule needs perSample",
                    ".perSample",
                ),
                cel(
                    "self.schedule != 'inverse-sqrt' || (has(self.alphaByWorkers) && size(self.alphaByWorkers) > 0)",
                    "the inverse-sqrt schedule needs alphaByWorkers",
                    ".alphaByWorkers",
                ),
                cel(
                    "self.schedule != 'constant' || has(self.value)",
                    "the constant schedule needs value",
                    ".value",
                ),
                cel(
                    "self.schedule != 'warmup-inverse-sqrt' || (has(self.value) && has(self.warmupSteps))",
                    "the warmup-inverse-sqrt schedule needs value and warmupSteps",
                    ".warmupSteps",
                ),
                cel(
                    "self.schedule != 'exponential-warmup-step-decay' || (has(self.value) && has(self.warmupSteps))",
                    "the exponential-warmup-step-decay schedule needs value and warmupSteps",
                    ".warmupSteps",
                ),
                cel(
                    "!has(self.milestones) || (self.milestones.isSorted() && "
                    "self.milestones.all(m, self.milestones.filter(n, n == m).size() == 1))",
                    "milestones must be strictly increasing",
                    ".milestones",
                ),
            ]
        }
    )

    schedule: Schedule
    """multistep (needs perSample), inverse-sqrt (needs alphaByWorkers), constant (needs value),
    warmup-inverse-sqrt (needs value and warmupSteps; task 4b's) or exponential-warmup-step-decay (needs value and
    warmupSteps; task 4a's, docs/tasks-translation.md)."""
    per_sample: Annotated[float, Field(gt=0, le=10)] | None = Field(
        default=None,
        description="multistep: eta, the learning rate per sample; a rank steps with eta * batchSizePerWorker "
        "(before linear scaling).",
    )
    value: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="constant: the learning rate of every step; warmup-inverse-sqrt and "
        "exponential-warmup-step-decay: the peak rate, reached at warmupSteps.",
    )
    warmup_steps: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        default=None,
        description="warmup-inverse-sqrt: optimizer steps of linear warm-up from 0 to value, after which the rate is "
        "value * sqrt(warmupSteps / step) (fairseq's inverse_sqrt); exponential-warmup-step-decay: steps of "
        "exponential warm-up from value / 100 to value.",
    )
    decay_start: Annotated[float, Field(ge=0, le=1)] = 0.4
    """exponential-warmup-step-decay: the fraction of all training steps after which the first decay applies
    (default 0.4)."""
    decay_interval: Annotated[float, Field(gt=0, le=1)] = 0.05
    """exponential-warmup-step-decay: the fraction of all training steps between decays (default 0.05)."""
    max_decays: Annotated[int, Field(ge=0, le=1000)] = 4
    """exponential-warmup-step-decay: the most decays (default 4)."""
    linear_scaling: bool = Field(
        default=True,
        description="multistep: scale eta*b up to eta*b*k (k = world size) over the warm-up epochs (default true).",
    )
    warmup_epochs: Annotated[int, Field(ge=0, le=1000)] = 0
    """multistep: epochs of linear warm-up from eta*b to the peak rate (default 0: start at the peak). Less than
    maxEpochs."""
    milestones: Annotated[list[Annotated[int, Field(ge=1, le=100_000)]], Field(max_length=16)] = Field(
        default_factory=list
    )
    """multistep: epochs after which the rate is multiplied by decayFactor; strictly increasing, each less than
    maxEpochs."""
    decay_factor: Annotated[float, Field(gt=0, le=1)] = 0.1
    """multistep: factor applied at every milestone (default 0.1); exponential-warmup-step-decay: at every decay
    (task 4a: 0.5)."""
    alpha_by_workers: Annotated[list[AlphaForWorkers], Field(max_length=32)] = Field(default_factory=list)
    """inverse-sqrt: alpha per world size; the row with the largest minWorkers not above the world size applies."""
    decay_unit: Literal["step", "epoch"] = Field(
        default="step",
        description="inverse-sqrt: what t counts in alpha/sqrt(t): step (default, optimizer steps from 1) or epoch.",
    )

    @model_validator(mode="after")
    def _rules(self) -> LearningRate:
        # Mirrors the CEL rules so a local run fails as early and as clearly as kubectl apply.
        if self.schedule is Schedule.MULTI_STEP and self.per_sample is None:
            raise ValueError("perSample: the multistep schedule needs perSample")
        if self.schedule is Schedule.INVERSE_SQRT and not self.alpha_by_workers:
            raise ValueError("alphaByWorkers: the inverse-sqrt schedule needs alphaByWorkers")
        if self.schedule is Schedule.CONSTANT and self.value is None:
            raise ValueError("value: the constant schedule needs value")
        if self.schedule in TRANSLATION_SCHEDULES and (self.value is None or self.warmup_steps is None):
            raise ValueError(f"warmupSteps: the {self.schedule.value} schedule needs value and warmupSteps")
        if self.milestones != sorted(set(self.milestones)):
            raise ValueError("milestones: milestones must be strictly increasing")
        return self
