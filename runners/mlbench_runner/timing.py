"""Per-step phase timing that does not perturb what it measures.

On CPU a phase is ``time.perf_counter`` around the work (CPU work is synchronous). On
CUDA a phase is a pair of CUDA events on the current stream, resolved lazily: events are
queued and read back only once they have completed (or at ``flush(wait=True)``, once per
epoch), so timing adds no per-step device synchronisation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

#: Step phases in order. ``compression`` holds an algorithm's extra kernels (compress, decompress, error
#: feedback) and counts as compute; ``communication`` holds only collectives.
PHASES = ("data", "forward", "backward", "compression", "communication", "optimizer")


@dataclass
class StepTiming:
    """Seconds per phase of one optimizer step."""

    step: int
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    @property
    def timed(self) -> bool:
        """False for a step run with the phase timer off: it counts as done, its times are unknown."""
        return bool(self.phases)


class PhaseTimer:
    """Collects :class:`StepTiming` records; ``flush`` returns the ones that are resolved."""

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.cuda = device.type == "cuda"
        #: Off (``MLBENCH_PHASE_TIMING=0``) only to measure what timing itself costs: steps are still
        #: counted (progress, ``mlbench_steps_total``) but come back with no phases, as untimed.
        self.enabled = enabled
        self._current: StepTiming | None = None
        self._pending_cuda: list[tuple[int, str, torch.cuda.Event, torch.cuda.Event]] = []
        self._steps: dict[int, StepTiming] = {}
        self._open: dict[int, int] = {}  # step -> phases not yet resolved

    def start_step(self, step: int) -> None:
        self._current = StepTiming(step)
        self._steps[step] = self._current
        self._open[step] = 0

    def end_step(self) -> None:
        self._current = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block as phase ``name`` of the current step."""
        current = self._current
        assert current is not None, "start_step() first"
        if not self.enabled:
            yield
        elif self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._pending_cuda.append((current.step, name, start, end))
            self._open[current.step] += 1
        else:
            t0 = time.perf_counter()
            yield
            current.phases[name] = current.phases.get(name, 0.0) + time.perf_counter() - t0

    def flush(self, wait: bool = False) -> list[StepTiming]:
        """Completed steps, oldest first. ``wait`` blocks on outstanding CUDA events."""
        if self.cuda:
            still: list[tuple[int, str, torch.cuda.Event, torch.cuda.Event]] = []
            for i, (step, name, start, end) in enumerate(self._pending_cuda):
                if not wait and not end.query():
                    still = self._pending_cuda[i:]
                    break
                end.synchronize()
                record = self._steps[step]
                record.phases[name] = record.phases.get(name, 0.0) + start.elapsed_time(end) / 1000.0
                self._open[step] -= 1
            self._pending_cuda = still
        current = self._current.step if self._current is not None else None
        done = [s for s in sorted(self._steps) if self._open[s] == 0 and s != current]
        for s in done:
            del self._open[s]
        return [self._steps.pop(s) for s in done]


class WallClock:
    """Wall time since construction (run start) via perf_counter."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def origin(self) -> float:
        """The run's start as wall-clock time (seconds since the epoch), exclusions applied: what a checkpoint
        keeps so that a restarted process continues this clock."""
        return time.time() - self.elapsed()

    def resume(self, origin: float) -> None:
        """Continue a clock whose :meth:`origin` was ``origin``: the time since, a restart included, counts."""
        self.start = time.perf_counter() - max(0.0, time.time() - origin)

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` (already spent, e.g. one-time data ingest) out of the elapsed time."""
        self.start += max(0.0, seconds)
