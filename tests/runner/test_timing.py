"""PhaseTimer bookkeeping, including the lazy CUDA-event path (with stand-in events)."""

from __future__ import annotations

import time

import pytest
import torch

from mlbench_runner import timing
from mlbench_runner.timing import PhaseTimer


def test_cpu_phases_and_flush() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    timer.start_step(0)
    with timer.phase("forward"):
        time.sleep(0.01)
    assert timer.flush() == []  # the step is still open
    timer.end_step()
    (step,) = timer.flush()
    assert step.step == 0
    assert 0.009 < step.phases["forward"] < 0.5
    assert step.total == step.phases["forward"]


class FakeEvent:
    """Stands in for torch.cuda.Event: completes when the test says the device got there."""

    clock = 0.0
    done_until = -1.0
    synced: list[FakeEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.t: float | None = None

    def record(self) -> None:
        FakeEvent.clock += 1.0
        self.t = FakeEvent.clock

    def query(self) -> bool:
        return self.t is not None and self.t <= FakeEvent.done_until

    def synchronize(self) -> None:
        FakeEvent.synced.append(self)
        assert self.t is not None
        FakeEvent.done_until = max(FakeEvent.done_until, self.t)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert end.t is not None
        assert self.t is not None
        return (end.t - self.t) * 1000.0  # ms, like CUDA


def test_cuda_events_resolve_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing.torch.cuda, "Event", FakeEvent)
    FakeEvent.clock, FakeEvent.done_until, FakeEvent.synced = 0.0, -1.0, []
    timer = PhaseTimer(torch.device("cuda", 0))
    for s in range(3):
        timer.start_step(s)
        for phase in ("forward", "backward"):
            with timer.phase(phase):
                pass
        timer.end_step()
    assert timer.flush() == []  # nothing completed on the "device": no waiting, no results
    assert FakeEvent.synced == []
    FakeEvent.done_until = 8.0  # the device finished steps 0 and 1 (events 1..8)
    steps = timer.flush()
    assert [s.step for s in steps] == [0, 1]
    assert steps[0].phases == {"forward": 1.0, "backward": 1.0}
    rest = timer.flush(wait=True)  # epoch end: block on what is left
    assert [s.step for s in rest] == [2]
    assert timer.flush(wait=True) == []
