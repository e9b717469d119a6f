"""What the per-phase instrumentation costs.

(a) Absolute: a step of five empty timed phases plus the periodic flush, against the
    same loop untimed (CPU path: perf_counter; the CUDA path records 10 events instead).
(b) Relative: ResNet-20 training steps (batch 32) with the PhaseTimer vs without,
    interleaved in blocks so machine noise hits both alike; median per-step time.

    .venv/bin/python benchmarks/runner_timing_overhead.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from mlbench_runner.rank.models import CifarResNet
from mlbench_runner.timing import PHASES, PhaseTimer


def empty_steps(n: int, timed: bool) -> float:
    timer = PhaseTimer(torch.device("cpu"))
    t0 = time.perf_counter()
    for step in range(n):
        if timed:
            timer.start_step(step)
            for phase in PHASES:
                with timer.phase(phase):
                    pass
            timer.end_step()
            if step % 25 == 0:
                timer.flush()
        else:
            for _phase in PHASES:
                pass
    return (time.perf_counter() - t0) / n


def resnet_blocks(blocks: int, steps: int, threads: int) -> tuple[float, float]:
    torch.set_num_threads(threads)
    model = CifarResNet(20, "m1")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    timer = PhaseTimer(torch.device("cpu"))

    def step(i: int, timed: bool) -> None:
        if timed:
            timer.start_step(i)
            with timer.phase("data"):
                xb = x.clone()
            with timer.phase("forward"):
                loss = F.cross_entropy(model(xb), y)
            with timer.phase("backward"):
                loss.backward()
            with timer.phase("communication"):
                pass
            with timer.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            timer.end_step()
            timer.flush()
        else:
            xb = x.clone()
            loss = F.cross_entropy(model(xb), y)
            loss.backward()
            opt.step()
            opt.zero_grad()

    for i in range(5):
        step(i, False)
    plain: list[float] = []
    timed: list[float] = []
    for b in range(blocks):
        for mode in (False, True) if b % 2 == 0 else (True, False):
            t0 = time.perf_counter()
            for i in range(steps):
                step(i, mode)
            (timed if mode else plain).append((time.perf_counter() - t0) / steps)
    return statistics.median(plain), statistics.median(timed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--empty-steps", type=int, default=200_000)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    bare, timed = empty_steps(args.empty_steps, False), empty_steps(args.empty_steps, True)
    print(
        f"(a) instrumentation per step ({len(PHASES)} phases + flush): {1e6 * (timed - bare):.2f} us "
        f"(timed {1e6 * timed:.2f} us vs bare loop {1e6 * bare:.2f} us)"
    )
    plain, with_timer = resnet_blocks(args.blocks, args.steps, args.threads)
    print(
        f"(b) ResNet-20 step, batch 32, {args.threads} thread(s): {1000 * plain:.2f} ms plain, "
        f"{1000 * with_timer:.2f} ms timed; difference {100 * (with_timer - plain) / plain:+.2f} % "
        f"(median of {args.blocks} interleaved blocks of {args.steps} steps; noise level is about this size)"
    )


if __name__ == "__main__":
    main()
