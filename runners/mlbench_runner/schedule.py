"""Learning rate per optimizer step, from the RunConfig's resolved schedule.

multistep: linear from ``initial_lr`` (step 0) to ``peak_lr`` (step = warmup_epochs x
steps_per_epoch), evaluated every step; then ``peak_lr x decay_factor^k`` where k counts
the milestones m with epoch >= m (0-based epochs: milestone 82 applies from the 83rd
epoch on, like torch's MultiStepLR). inverse-sqrt: alpha / sqrt(t) with t = step + 1
(or epoch + 1 when decay_unit is "epoch"), so the first step uses alpha. warmup-inverse-sqrt: fairseq's
inverse_sqrt with t = step + 1 (task 4b).
"""

from __future__ import annotations

import math

from mlbench_api.config import ResolvedSchedule
from mlbench_api.schedule import Schedule


def learning_rate(schedule: ResolvedSchedule, step: int, steps_per_epoch: int) -> float:
    """The rate for 0-based optimizer ``step`` when an epoch has ``steps_per_epoch`` steps."""
    if steps_per_epoch < 1:
        raise ValueError("steps_per_epoch must be at least 1")
    epoch = step // steps_per_epoch
    if schedule.schedule is Schedule.MULTI_STEP:
        warmup_steps = schedule.warmup_epochs * steps_per_epoch
        if step < warmup_steps:
            return schedule.initial_lr + (schedule.peak_lr - schedule.initial_lr) * step / warmup_steps
        decays = sum(1 for m in schedule.milestones if epoch >= m)
        return schedule.peak_lr * schedule.decay_factor**decays
    if schedule.schedule is Schedule.INVERSE_SQRT:
        alpha = schedule.alpha if schedule.alpha is not None else schedule.initial_lr
        t = (epoch if schedule.decay_unit == "epoch" else step) + 1
        return alpha / math.sqrt(t)
    if schedule.schedule is Schedule.WARMUP_INVERSE_SQRT:
        return warmup_inverse_sqrt(step + 1, schedule.peak_lr, schedule.warmup_steps)
    return schedule.peak_lr


def warmup_inverse_sqrt(step: int, peak: float, warmup: int, initial: float = 0.0) -> float:
    """fairseq's inverse_sqrt: linear from ``initial`` to ``peak`` over ``warmup`` updates, then
    ``peak * sqrt(warmup / step)``; ``step`` counts optimizer updates from 1."""
    if step < warmup:
        return initial + (peak - initial) * step / warmup
    return peak * (warmup / max(step, 1)) ** 0.5
