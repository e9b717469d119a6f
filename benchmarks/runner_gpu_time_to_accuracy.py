"""Task 1a time-to-80 % on one GPU under the closed-division rules, three ways, one run.

1. ``fast``: mlbench_runner's Trainer with its fast step (``MLBENCH_FAST_PATH=auto``: on a GPU,
   forward, backward and optimizer replayed as CUDA graphs over flat buffers; see
   docs/runner.md), data as uint8 tensors on the GPU, batch-level augmentation on the GPU.
2. ``eager``: the same Trainer with the eager reference step (``MLBENCH_FAST_PATH=off``).
   ``fast`` runs with ``MLBENCH_COMPILE=0``; ``--paths compiled`` adds it with its model through
   ``torch.compile`` before capture (``MLBENCH_COMPILE=1``), which is what the runner's default
   (``auto``) runs on a GPU; compiling is initialisation, outside the clock, as MLPerf allows.
3. ``plain``: the same recipe written the usual way: a per-sample ``Dataset`` doing
   pad/crop/flip/normalise in numpy, a ``DataLoader`` (shuffle, workers, pinned memory),
   eager fp32 (what torchvision's CIFAR10 + transforms would do; torchvision itself is
   not needed).

Closed-division 1a recipe with k = 1: ResNet-20 m1, batch 32, lr 0.1/256 x 32, momentum 0.9
Nesterov, weight decay 1e-4, x0.1 at epochs 82 and 109, at most 164 epochs; fp32 (TF32 inside
cuDNN convolutions, PyTorch's default); cuDNN autotunes its convolution algorithms on every
path (``--cudnn-benchmark 0``: its heuristics, on every path); the runner's collectives go
through nccl even at world size 1 (``--process-group 0``: skipped, as a 1-worker run does); the
clock starts before the data is loaded and includes every per-epoch test evaluation; CUDA-graph
capture (on synthetic batches) is initialisation and left out, as MLPerf allows for
compilation, and so is the plain path's first training step on a synthetic batch (where cuDNN
autotunes the same training shapes). Data: the JPEG copy of CIFAR-10 (decoded once into the runner's cache; that
one-time decode is left out of every path's clock, as in the runner).

All paths are compared on the same kind of time, host wall clock with the GPU
synchronised at the epoch boundaries: ``wall s/epoch (train)`` is an epoch's training
steps, ``wall s/epoch (+eval)`` adds its test evaluation, and ``time-to-goal`` is wall clock
from before data loading to the end of the evaluation that met the target. The runner's
``trainSeconds`` (the sum of its CUDA-event phase times: *device* time, which leaves out
host gaps between kernels) is shown separately as ``device s/epoch``.

``--profile N`` adds a step table over N steps after 20 warm-up steps for the runner's steps
(fast and eager, compiled too when ``--paths`` has it, or the rows ``--profile-paths`` names):
ms/step (synchronised wall clock, with the phase timer's CUDA events on and off: the
instrumentation's cost), CUDA launches per step (runtime calls that start GPU work: kernel
and graph launches, copies, memsets) and kernels per step (GPU activities the profiler saw),
the GPU-busy fraction (union of kernel times / wall, under the profiler), the fast step's ms/step
with the other cuDNN choice (what autotuning is worth), and the largest
parameter difference between the fast and the eager step after those N steps from one start.

``--output`` is rewritten after every path and after the profile, so a run cut short (the device's
time limit) keeps what it measured; ``--report`` prints the tables of such files again, and one
line per path over all of them.

``--cpu-table`` prints the CPU side instead: 2 ranks over gloo on this machine, the eager
and the fast (flat) step and DDP (the comparison baseline), samples/s of step time and ms/step,
in turn, ``--repeats`` rounds. ``--paths ddp`` adds DDP (world size 1) to the GPU table.

    python benchmarks/runner_gpu_time_to_accuracy.py --profile 200            # on a GPU machine
    python benchmarks/runner_gpu_time_to_accuracy.py --device cpu --max-epochs 1 --subset 512   # smoke
    python benchmarks/runner_gpu_time_to_accuracy.py --cpu-table --subset 2048 --steps 60 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mlbench_api import BenchmarkRun, BenchmarkTaskSpec, RunConfig
from mlbench_api.config import effective_config
from mlbench_api.results import RunSummary
from mlbench_runner.data import load_dataset
from mlbench_runner.options import Options
from mlbench_runner.rank.models import CifarResNet
from mlbench_runner.rank.setup import Setup
from mlbench_runner.rank.train import Trainer
from mlbench_runner.schedule import learning_rate
from mlbench_runner.tools.processes import importable_env, run_processes
from mlbench_runner.tools.recipes import catalog_recipe, shared_cifar10
from mlbench_runner.world import World

SINGLE = World(0, 1, 0, 1, "127.0.0.1", 0, "single")
#: CUDA runtime/driver calls that start work on the GPU (what a launch-bound step pays for, one by one). Only
#: for a trace without GPU activities: with them, launches are counted by their correlation ids, which also
#: covers the names this list lacks (torch on CUDA 13 launches through ``__cudaLaunchKernel``).
LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "__cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
    "cuGraphLaunch",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
)
GPU_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")


#: A BenchmarkRun's default seed (``spec.seed``): the runs of the H100 table were made with it.
DEFAULT_SEED = 42


def closed_1a(data: str, max_epochs: int, subset: int | None, target: float) -> BenchmarkTaskSpec:
    """The catalog's task 1a, read from the JPEG tarball; shorter only in smoke mode."""
    return catalog_recipe("cifar10-resnet20", data=data, train_subset=subset, max_epochs=max_epochs, target=target)


def make_config(
    spec: BenchmarkTaskSpec, device: str, out: str, algorithm: str = "allreduce-sgd", seed: int = DEFAULT_SEED
) -> RunConfig:
    gpu = device == "cuda"
    run = BenchmarkRun.model_validate(
        {
            "metadata": {"name": "tta-1a"},
            "spec": {
                "taskRef": {"name": "cifar10-resnet20"},
                "workers": 1,
                "seed": seed,
                "algorithm": algorithm,
                "backend": "nccl" if gpu else "gloo",
                **({"resources": {"gpu": 1}} if gpu else {}),
            },
        }
    )
    return effective_config(run, "cifar10-resnet20", spec, output_dir=out, metrics_port=0)


def epoch_walls(events_file: Path) -> list[float]:
    """Wall seconds from each ``epoch_start`` to its ``eval_accuracy`` event (train + evaluation)."""
    starts: dict[int, int] = {}
    walls: list[float] = []
    for line in events_file.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "epoch_start":
            starts[event["epoch"]] = event["time_ms"]
        elif event.get("event") == "eval_accuracy" and event["epoch"] in starts:
            walls.append((event["time_ms"] - starts[event["epoch"]]) / 1000)
    return walls


def base_options(bf16: bool, cudnn_benchmark: bool, process_group: bool, fast_path: str = "auto") -> Options:
    """The knobs every runner path of one invocation shares (``fast_path``: what the fast paths ask for)."""
    return Options(
        precision="bf16" if bf16 else "fp32",
        channels_last=bf16,
        cudnn_benchmark=cudnn_benchmark,
        process_group=process_group,
        fast_path=fast_path,
    )


def runner_options(base: Options, path: str) -> Options:
    """The knobs of one runner path: ``fast`` and ``compiled`` take the fast step (``compiled`` through
    torch.compile), ``eager`` and ``ddp`` the eager reference step."""
    fast = path in ("fast", "compiled")
    compiled = "1" if path == "compiled" else "0"
    return dataclasses.replace(base, fast_path=base.fast_path if fast else "off", compile=compiled)


def _order(s: Setup) -> torch.Tensor:
    """One fixed permutation of the training set, the same for every step table row."""
    return torch.randperm(s.kernel.n_train, device=s.device, generator=torch.Generator(s.device).manual_seed(1))


def run_runner(config: RunConfig, opts: Options) -> dict[str, object]:
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        summary = Trainer(config, SINGLE, opts).run()
    assert summary is not None
    # The trainer waits for every CUDA event at each epoch end and the evaluation ends in a
    # host read of the counts, so these event times are synchronised wall clock.
    walls = epoch_walls(Path(config.output_dir) / "events.jsonl")
    evaluated = max(len(walls), 1)
    eval_s = summary.phases.evaluation
    env = summary.environment
    return {
        "time_to_goal_s": summary.time_to_goal_seconds,
        "wall_s": summary.wall_clock_seconds,
        "epochs": summary.epochs,
        "best_accuracy": summary.best_accuracy,
        "eval_s": eval_s,
        "wall_s_per_epoch": sum(walls) / evaluated,
        "wall_train_s_per_epoch": (sum(walls) - eval_s) / evaluated,
        "device_train_s_per_epoch": summary.train_seconds / max(summary.epochs, 1e-9),
        "training_step": env.training_step,
        "training_step_reason": env.training_step_reason,
        "capture_s": env.capture_seconds,
        "tf32": env.tf32,
        "cudnn_benchmark": env.cudnn_benchmark,
        "compiled": env.compiled,
    }


def _steps(s: Setup, order: torch.Tensor, first: int, n: int, lr: float) -> torch.Tensor:
    loss = torch.zeros((), device=s.device)
    for i in range(first, first + n):
        j = i % (len(order) // s.batch)
        loss += s.step(i, order[j * s.batch : (j + 1) * s.batch], lr)
    return loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ms_per_step(s: Setup, order: torch.Tensor, n: int, lr: float, first: int = 20) -> float:
    """Synchronised wall ms per step over ``n`` steps from step ``first``."""
    _sync(s.device)
    t0 = time.perf_counter()
    _steps(s, order, first, n, lr)
    _sync(s.device)
    s.timer.flush(wait=True)
    return 1e3 * (time.perf_counter() - t0) / n


#: Blocks the instrumentation's cost is measured in: phase timing on and off alternate, median of each.
OVERHEAD_BLOCKS = 6


def _ms_per_step_with_and_without_timing(s: Setup, order: torch.Tensor, n: int, lr: float) -> tuple[float, float]:
    """ms/step with the phase timer's CUDA events on and off, on one set-up (the same captured graphs), in
    alternating blocks after 20 warm-up steps: the medians, so drift and noise hit both alike."""
    _steps(s, order, 0, 20, lr)  # warm-up (and, for the fast step, the first replays)
    block = max(n // OVERHEAD_BLOCKS, 1)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(OVERHEAD_BLOCKS):
        timed = i % 2 == 0
        s.timer.enabled = timed
        times[timed].append(_ms_per_step(s, order, block, lr, first=20 + i * block))
    s.timer.enabled = True
    return float(np.median(times[True])), float(np.median(times[False]))


def _trace_counts(s: Setup, order: torch.Tensor, n: int, lr: float, trace: Path) -> dict[str, float]:
    """Launches and kernels per step, and the GPU's busy time, from a Kineto trace of ``n`` steps taken after
    5 profiled warm-up steps (the profiler's first steps are skewed; its schedule leaves them out).

    Launches: distinct correlation ids among the GPU activities (one per launch call, a graph launch once),
    which holds whatever the runtime calls are named; without GPU activities (CPU), the calls by name."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if s.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    warm = 5
    schedule = torch.profiler.schedule(wait=0, warmup=warm, active=n, repeat=1)
    per_epoch = len(order) // s.batch

    def one_step(i: int) -> None:  # the step alone: no loss accumulator, whose kernels would be counted
        j = i % per_epoch
        s.step(i, order[j * s.batch : (j + 1) * s.batch], lr)

    with torch.profiler.profile(activities=activities, schedule=schedule) as prof:
        for i in range(warm):
            one_step(i)
            prof.step()
        _sync(s.device)
        t0 = time.perf_counter()
        for i in range(n):
            one_step(warm + i)
            if i < n - 1:
                prof.step()
        _sync(s.device)
        wall_us = 1e6 * (time.perf_counter() - t0)  # before the last prof.step(), which stops and collects
        prof.step()
    s.timer.flush(wait=True)
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text()).get("traceEvents", []) if e.get("ph") == "X"]
    gpu_events = [e for e in events if e.get("cat") in GPU_ACTIVITIES]
    gpu = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu_events)
    correlations = {(e.get("args") or {}).get("correlation") for e in gpu_events} - {None}
    launches = len(correlations) if gpu_events else sum(1 for e in events if e.get("name") in LAUNCH_CALLS)
    busy, end = 0.0, float("-inf")
    for start, stop in gpu:  # union of the intervals
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return {
        "launches_per_step": launches / n,
        "kernels_per_step": len(gpu) / n,
        "gpu_busy": busy / wall_us,  # under the profiler
        "gpu_ms_per_step": busy / n / 1e3,
    }


#: The step table's possible rows, in its order.
PROFILE_PATHS = ("fast", "eager", "compiled")


def step_profile(
    config: RunConfig, base: Options, n: int, trace_dir: Path, names: Sequence[str] = ("fast", "eager")
) -> dict[str, dict[str, Any]]:
    """The runner's steps side by side on one device, and the fast and eager parameters' difference after ``n`` steps.

    The rows, of ``names``: ``fast``, ``eager`` and ``compiled`` (the fast step with torch.compile). With
    ``fast`` among them, the fast step is also timed with the other cuDNN choice (autotuned algorithms or
    cuDNN's heuristics), which is what autotuning is worth; with ``fast`` and ``eager``, their parameters
    are compared after ``n`` steps from one start. On CPU (a smoke run of this code) there are no kernels
    to count.
    """
    rows: dict[str, dict[str, Any]] = {}
    setups: dict[str, torch.Tensor] = {}
    lr = config.lr.initial_lr
    device = torch.device("cpu")
    for name in names:
        opts = runner_options(base, name)
        torch.manual_seed(0)
        s = Trainer(config, SINGLE, opts)._setup()
        device, order = s.device, _order(s)
        timed, untimed = _ms_per_step_with_and_without_timing(s, order, n, lr)
        counts = _trace_counts(s, order, min(n, 50), lr, trace_dir / f"{name}.json")
        rows[name] = {
            "path": s.step.path.value + ("+compile" if opts.compile == "1" else ""),
            "ms_per_step": timed,
            "ms_per_step_untimed": untimed,
            **counts,
            "gpu_busy_unprofiled": counts["gpu_ms_per_step"] / timed,  # the profiler slows the host side
        }
    if device.type == "cuda" and "fast" in rows:  # the other cuDNN choice
        other = dataclasses.replace(base, cudnn_benchmark=not base.cudnn_benchmark)
        s = Trainer(config, SINGLE, runner_options(other, "fast"))._setup()
        order = _order(s)
        _steps(s, order, 0, 20, lr)
        rows["fast"]["ms_per_step_other_cudnn"] = _ms_per_step(s, order, n, lr)
        rows["fast"]["cudnn_benchmark"] = base.cudnn_benchmark
    if not {"fast", "eager"} <= rows.keys():
        return rows
    # Parity: the steps from one start (seeded model, same batches and augmentation), after 1 step and after
    # n; a second eager run from the same start is the control: what round-off alone (non-deterministic
    # kernels, TF32, autotuned algorithms) makes of the same step on this GPU.
    for name, path in (("fast", "fast"), ("eager", "eager"), ("control", "eager")):
        s = Trainer(config, SINGLE, runner_options(base, path))._setup()
        order = _order(s)
        setups[name + "@0"] = _flat_parameters(s)
        _steps(s, order, 0, 1, lr)
        setups[name + "@1"] = _flat_parameters(s)
        _steps(s, order, 1, n - 1, lr)
        setups[name] = _flat_parameters(s)
    eager = setups["eager"]
    rows["fast"]["max_param_difference"] = float((setups["fast"] - eager).abs().max())
    rows["fast"]["max_param_difference_1_step"] = float((setups["fast@1"] - setups["eager@1"]).abs().max())
    rows["fast"]["max_param_difference_eager_control"] = float((setups["control"] - eager).abs().max())
    rows["fast"]["max_param"] = float(eager.abs().max())
    # how far the steps moved the parameters: a difference of 0 means the same arithmetic, not that nothing ran
    rows["fast"]["max_param_change"] = float((eager - setups["eager@0"]).abs().max())
    rows["fast"]["same_start"] = all(
        bool(torch.equal(setups[name + "@0"], setups["eager@0"])) for name in ("fast", "control")
    )
    return rows


def _flat_parameters(s: Setup) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in s.model.parameters()]).clone()


#: The CPU table's rows: (label, MLBENCH_FAST_PATH, algorithm). ``ddp`` is the comparison baseline:
#: torch DistributedDataParallel (bucketed all-reduce overlapped with backward) with the eager step.
CPU_ROWS = (("eager", "off", "allreduce-sgd"), ("flat", "auto", "allreduce-sgd"), ("ddp", "off", "ddp"))


def cpu_table(spec: BenchmarkTaskSpec, steps: int, ranks: int, repeats: int) -> None:
    """The CPU side: ``ranks`` gloo ranks on this machine, each of :data:`CPU_ROWS` in turn, ``repeats`` rounds.

    Under ddp the all-reduce runs inside ``backward`` (overlapped, not separable), so its ``comm ms``
    is 0 and its compute column carries the communication: compare ``ms/step``.
    """
    print(
        f"\n# CPU: {ranks} ranks over gloo, {os.cpu_count()} cores, {steps} steps of batch 32 per rank, task 1a's model"
    )
    print(f"{'row':6} {'step':8} {'samples/s':>10} {'ms/step':>9} {'compute ms':>11} {'comm ms':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, mode, algorithm) in enumerate(CPU_ROWS * repeats):
            out = Path(tmp) / f"{label}-{i}"
            run = BenchmarkRun.model_validate(
                {
                    "metadata": {"name": "cpu"},
                    "spec": {"taskRef": {"name": "t"}, "workers": ranks, "algorithm": algorithm},
                }
            )
            config = effective_config(run, "cifar10-resnet20", spec, output_dir=str(out), metrics_port=0)
            out.mkdir(parents=True)
            (out / "config.json").write_text(config.dump())
            threads = str(max(1, (os.cpu_count() or 1) // ranks))
            env = dict(importable_env(dict(os.environ)), MLBENCH_THREADS=threads, MLBENCH_FAST_PATH=mode)
            env["MLBENCH_MAX_STEPS"] = str(steps)
            lines: list[str] = []
            if run_processes(out / "config.json", ranks, env, lines.append):
                raise SystemExit("\n".join(lines[-30:]))
            r = RunSummary.model_validate_json((out / "summary.json").read_text())
            print(
                f"{label:6} {r.environment.training_step or mode:8} {r.samples_per_second:>10.1f} "
                f"{1e3 * r.train_seconds / r.steps:>9.1f} {1e3 * r.compute_seconds / r.steps:>11.1f} "
                f"{1e3 * r.communication_seconds / r.steps:>9.1f}",
                flush=True,
            )


class PlainCifar(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Per-sample pipeline: 4-pixel zero pad + random crop + flip, then normalise (numpy)."""

    def __init__(
        self, x: np.ndarray, y: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...], train: bool
    ) -> None:
        self.x, self.y, self.train = x, y, train
        self.mean = np.asarray(mean, dtype=np.float32)[:, None, None]
        self.std = np.asarray(std, dtype=np.float32)[:, None, None]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = np.asarray(self.x[i], dtype=np.float32)
        if self.train:
            padded = np.pad(img, ((0, 0), (4, 4), (4, 4)))
            dy, dx = (int(v) for v in torch.randint(0, 9, (2,)))
            img = padded[:, dy : dy + 32, dx : dx + 32]
            if torch.rand(()) < 0.5:
                img = img[:, :, ::-1]
        img = (img - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(img)), int(self.y[i])


def _autotune_outside_the_clock(model: torch.nn.Module, device: torch.device) -> float:
    """One training step's forward and backward on a copy of the model and a synthetic batch: cuDNN picks its
    algorithms for the training shapes at their first use, which the runner's fast step does in its capture
    warm-up, outside its clock; so here too. Returns the seconds it took (left out of the clock)."""
    if device.type != "cuda":
        return 0.0
    t0 = time.perf_counter()
    scratch = copy.deepcopy(model)  # its BatchNorm statistics and gradients are thrown away
    x = torch.zeros(32, 3, 32, 32, device=device)
    F.cross_entropy(scratch(x), torch.zeros(32, dtype=torch.long, device=device)).backward()
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def run_plain(config: RunConfig, device: torch.device, workers: int, cudnn: bool) -> dict[str, object]:
    torch.backends.cudnn.benchmark = cudnn  # the runner's choice, so the paths differ only in the step
    start = time.perf_counter()
    task = config.task
    data = load_dataset(task.dataset)
    start += data.ingest_seconds  # one-time decode into the cache: outside the clock, as in the runner
    assert data.mean is not None
    assert data.std is not None
    train = PlainCifar(data.x_train, data.y_train, data.mean, data.std, train=True)
    test = PlainCifar(data.x_test, data.y_test, data.mean, data.std, train=False)
    g = torch.Generator().manual_seed(config.seed)
    pin = device.type == "cuda"
    loader = torch.utils.data.DataLoader(
        train,
        batch_size=32,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=pin,
        generator=g,
        persistent_workers=workers > 0,
    )
    test_loader = torch.utils.data.DataLoader(test, batch_size=500, num_workers=workers, pin_memory=pin)
    torch.manual_seed(config.seed)
    model = CifarResNet(20, "m1").to(device)
    start += _autotune_outside_the_clock(model, device)
    tr = task.training
    opt = torch.optim.SGD(
        model.parameters(),
        lr=config.lr.initial_lr,
        momentum=tr.momentum,
        nesterov=tr.nesterov,
        weight_decay=tr.weight_decay,
    )
    spe = len(loader)
    step, best, reached_at, epochs, train_s, eval_s = 0, 0.0, None, 0, 0.0, 0.0
    for epoch in range(tr.max_epochs):
        model.train()
        t0 = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            for group in opt.param_groups:
                group["lr"] = learning_rate(config.lr, step, spe)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in test_loader:
                correct += int((model(x.to(device)).argmax(1) == y.to(device)).sum())
        accuracy = correct / len(test)
        t2 = time.perf_counter()
        train_s, eval_s, epochs = train_s + t1 - t0, eval_s + t2 - t1, epoch + 1
        best = max(best, accuracy)
        if accuracy >= config.goal_target:
            reached_at = t2 - start
            break
    return {
        "time_to_goal_s": reached_at,
        "wall_s": time.perf_counter() - start,
        "epochs": float(epochs),
        "best_accuracy": best,
        "eval_s": eval_s,
        "wall_s_per_epoch": (train_s + eval_s) / max(epochs, 1),
        "wall_train_s_per_epoch": train_s / max(epochs, 1),
        "device_train_s_per_epoch": None,  # not measured: the plain recipe has no CUDA-event timer
    }


def print_profile(rows: dict[str, dict[str, Any]], n: int) -> None:
    print(f"\n# the runner's step, {n} steps after 20 warm-up steps (batch 32, ResNet-20)")
    print(
        f"{'step':20} {'ms/step':>8} {'untimed':>8} {'timing cost':>11} {'launches':>9} {'kernels':>8} "
        f"{'GPU ms':>7} {'GPU busy':>9} {'(profiled)':>10}"
    )
    for r in rows.values():
        cost = r["ms_per_step"] / r["ms_per_step_untimed"] - 1
        print(
            f"{r['path']:20} {r['ms_per_step']:>8.3f} {r['ms_per_step_untimed']:>8.3f} {100 * cost:>10.1f}% "
            f"{r['launches_per_step']:>9.1f} {r['kernels_per_step']:>8.1f} {r.get('gpu_ms_per_step', 0.0):>7.3f} "
            f"{100 * r.get('gpu_busy_unprofiled', 0.0):>8.1f}% {100 * r['gpu_busy']:>9.1f}%"
        )
    fast = rows.get("fast", {})
    if "ms_per_step_other_cudnn" in fast:
        chosen, other = ("autotuned", "heuristic") if fast["cudnn_benchmark"] else ("heuristic", "autotuned")
        print(
            f"fast step with cuDNN's {other} algorithms instead of its {chosen} ones: "
            f"{fast['ms_per_step_other_cudnn']:.3f} ms/step (timed)"
        )
    if "max_param_difference" in fast:
        print(
            f"largest parameter difference fast vs eager from one start: {fast['max_param_difference']:.3g} after "
            f"{n} steps, {fast.get('max_param_difference_1_step', float('nan')):.3g} after 1 "
            f"(largest parameter {fast['max_param']:.3g}); eager vs eager (the round-off control): "
            f"{fast.get('max_param_difference_eager_control', float('nan')):.3g} after {n}"
        )
        if "max_param_change" in fast:  # older saved results lack it
            print(
                f"largest parameter change over the {n} eager steps: {fast['max_param_change']:.3g}; "
                f"the three runs start from {'the same' if fast['same_start'] else 'DIFFERENT'} parameters"
            )
    print(
        f"ms/step: synchronised wall clock, median of {OVERHEAD_BLOCKS // 2} blocks; untimed: the phase timer's CUDA "
        "events off, in the blocks between (the same set-up)"
    )
    print(
        "launches: launch calls that started GPU work (distinct correlation ids of the GPU activities; a graph "
        "launch once); kernels: GPU activities; GPU ms: their union per step; GPU busy: GPU ms / ms/step "
        "(profiled: / the wall clock under the profiler, 5 warm-up steps left out)"
    )


def _time_to_goal(r: dict[str, Any]) -> str:
    return f"{r['time_to_goal_s']:.1f}s" if r["time_to_goal_s"] is not None else "not reached"


def _seed(args: dict[str, Any]) -> int:
    """A saved invocation's seed (files written before ``--seed`` existed used the default)."""
    return int(args.get("seed", DEFAULT_SEED))


def print_results(saved: dict[str, Any]) -> None:
    """The side-by-side table of one invocation (and its step table), from its saved record."""
    args, results, name = saved["args"], saved["results"], saved["device"]
    cuda = args["device"] == "cuda"
    tf32 = "; TF32 inside cuDNN convolutions" if cuda else ""
    if cuda:
        tf32 += f"; cuDNN {'autotuned' if args['cudnn_benchmark'] else 'heuristic'} algorithms"
    division = "open (bf16 autocast + channels_last)" if args["bf16"] else f"closed (fp32{tf32})"
    subset = f", first {args['subset']} train images" if args["subset"] else ""
    print(
        f"\n# task 1a recipe (k=1, b=32), {division}, target {args['target']:.0%}, device {name}, data: JPEG copy of "
        f"CIFAR-10{subset}, max {args['max_epochs']} epochs, seed {_seed(args)}"
    )
    backend = "nccl" if cuda else "gloo"
    collectives = f"through {backend} at world size 1" if args["process_group"] else "skipped at world size 1"
    print(f"runner's collectives (all-reduce of the gradients, stopping decisions): {collectives}")
    print(
        f"{'path':8} {'step':12} {'time-to-goal':>13} {'wall':>8} {'epochs':>7} {'best acc':>9} "
        f"{'wall s/epoch (train)':>21} {'wall s/epoch (+eval)':>21} {'device s/epoch':>15}"
    )
    for path, r in results.items():
        ttg, dev = _time_to_goal(r), r["device_train_s_per_epoch"]
        print(
            f"{path:8} {r.get('training_step') or '-'!s:12} {ttg:>13} {r['wall_s']:>7.1f}s "
            f"{r['epochs']:>7.0f} {100 * (r['best_accuracy'] or 0):>8.2f}% "
            f"{r['wall_train_s_per_epoch']:>21.2f} {r['wall_s_per_epoch']:>21.2f} "
            f"{'-' if dev is None else f'{dev:.2f}':>15}"
        )
    print("wall = synchronised host wall clock (same kind for every path); device = runner's CUDA-event time")
    for path, r in results.items():
        if r.get("training_step_reason"):
            capture = f"; set-up outside the clock {r['capture_s']:.2f} s" if r.get("capture_s") else ""
            compiled = ", torch.compile" if r.get("compiled") else ""
            print(f"{path}: {r['training_step']}{compiled} ({r['training_step_reason']}{capture})")
    for line in speedups(results):
        print(line)
    if saved["profile"]:
        print_profile(saved["profile"], args["profile"])


def speedups(results: dict[str, dict[str, Any]]) -> list[str]:
    """Plain over each runner path in the same invocation: time to goal, the issue's headline, and per epoch
    (training + evaluation), which does not depend on how many epochs each run happened to need."""
    plain = results.get("plain")
    if not plain:
        return []
    lines = []
    for path, r in results.items():
        if path == "plain":
            continue
        per_epoch = plain["wall_s_per_epoch"] / r["wall_s_per_epoch"] if r["wall_s_per_epoch"] else None
        goal = (
            f"{plain['time_to_goal_s'] / r['time_to_goal_s']:.2f}x"
            if plain.get("time_to_goal_s") and r.get("time_to_goal_s")
            else "-"
        )
        epochs = f" ({plain['epochs']:.0f} against {r['epochs']:.0f} epochs)"
        lines.append(
            f"plain / {path}: time to goal {goal}{epochs}, per epoch "
            f"{'-' if per_epoch is None else f'{per_epoch:.2f}x'}"
        )
    return lines


def print_report(files: Sequence[Path]) -> None:
    """Each saved invocation's tables (``--output`` files, e.g. one per stage of ``hack/gpu-run.sh lease``),
    then one line per path over all of them: what the issue's table needs, in one place."""
    records = [(f.stem, json.loads(f.read_text())) for f in files]
    for _, saved in records:
        print_results(saved)
    print(f"\n# all runs: {', '.join(f.name for f in files)}")
    print(
        f"{'run':10} {'path':8} {'step':12} {'division':8} {'time-to-goal':>13} {'epochs':>7} {'s/epoch (+eval)':>16}"
    )
    for stem, saved in records:
        division = "open" if saved["args"]["bf16"] else "closed"
        for path, r in saved["results"].items():
            step = r.get("training_step") or "-"
            print(
                f"{stem:10} {path:8} {step:12} {division:8} {_time_to_goal(r):>13} {r['epochs']:>7.0f} "
                f"{r['wall_s_per_epoch']:>16.2f}"
            )
    across = lease_paths(records)
    if "plain" in across and len(across) > 1:
        print("across the stages (same machine, one after another; closed division on the whole training set):")
        for line in speedups(across):
            print(line)
    repeated = over_runs(records)
    if repeated:
        print("paths run more than once (closed division, whole training set):")
        for line in repeated:
            print(line)


def closed_full_set(saved: dict[str, Any]) -> bool:
    """A saved invocation of the closed division on the whole training set (not bf16, not a subset): the runs
    whose times the issue's ratio may compare."""
    return not (saved["args"]["bf16"] or saved["args"]["subset"])


def over_runs(records: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each closed-division path measured more than once on the whole training set (the lease's seed stages):
    its times to goal, their mean and the mean wall s/epoch; then plain's mean over each such path's mean.

    Why: how many epochs a run needs varies with the seed (plain needed 15 where fast needed 13 in the one H100
    run), so a ratio to the goal from single runs says less than the same ratio of means."""
    runs: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for _, saved in records:
        if not closed_full_set(saved):
            continue
        for path, r in saved["results"].items():
            runs.setdefault(path, []).append((_seed(saved["args"]), r))
    means: dict[str, tuple[float | None, float]] = {}
    for path, rs in runs.items():
        goals = [r["time_to_goal_s"] for _, r in rs]
        reached = [g for g in goals if g is not None]
        means[path] = (
            statistics.fmean(reached) if len(reached) == len(goals) else None,
            statistics.fmean(r["wall_s_per_epoch"] for _, r in rs),
        )
    lines = []
    for path, rs in runs.items():
        if len(rs) < 2:
            continue
        goal, per_epoch = means[path]
        each = ", ".join(
            "not reached" if r["time_to_goal_s"] is None else f"{r['time_to_goal_s']:.1f} s" for _, r in rs
        )
        mean = "mean -" if goal is None else f"mean {goal:.1f} s"
        seeds = ", ".join(str(seed) for seed, _ in rs)
        lines.append(
            f"{path}: {len(rs)} runs (seeds {seeds}): time to goal {each}; {mean}; s/epoch (+eval) mean {per_epoch:.2f}"
        )
        if path != "plain" and "plain" in means:
            plain_goal, plain_epoch = means["plain"]
            ratio = f"{plain_goal / goal:.2f}x" if plain_goal and goal else "-"
            lines.append(f"plain / {path}, means: time to goal {ratio}, per epoch {plain_epoch / per_epoch:.2f}x")
    return lines


def lease_paths(records: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Every closed-division path run on the whole training set, keyed ``stage:path`` (``plain`` as it is), so
    that plain from one stage is put over a path measured in another (the lease runs compiled on its own)."""
    paths: dict[str, dict[str, Any]] = {}
    for stem, saved in records:
        if not closed_full_set(saved):
            continue
        for path, r in saved["results"].items():
            paths["plain" if path == "plain" else f"{stem}:{path}"] = r
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-epochs", type=int, default=164)
    p.add_argument("--subset", type=int, help="train on the first N images (smoke runs; not closed division)")
    p.add_argument("--target", type=float, default=0.80)
    p.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="the run's seed (model initialisation, data order, augmentation) on every path",
    )
    p.add_argument("--data", default=str(shared_cifar10()))
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers for the plain path")
    p.add_argument("--bf16", action="store_true", help="runner with bf16 autocast + channels_last (open division)")
    p.add_argument(
        "--paths",
        nargs="+",
        choices=("fast", "compiled", "eager", "ddp", "plain"),
        default=["fast", "eager", "plain"],
        help="compiled: fast with its model through torch.compile (MLBENCH_COMPILE); ddp: the runner with "
        "algorithm ddp (torch DistributedDataParallel, eager step), world size 1",
    )
    p.add_argument(
        "--cudnn-benchmark",
        type=int,
        choices=(0, 1),
        default=1,
        help="1: cuDNN autotunes its convolution algorithms on every path (the runner's MLBENCH_CUDNN_BENCHMARK)",
    )
    p.add_argument(
        "--process-group",
        type=int,
        choices=(0, 1),
        default=1,
        help="1: the runner's collectives go through nccl even at world size 1 (MLBENCH_PROCESS_GROUP); "
        "0: skipped, as a 1-worker run does",
    )
    p.add_argument(
        "--fast-path",
        choices=("auto", "on"),
        default="auto",
        help="the fast and compiled paths' MLBENCH_FAST_PATH: auto falls back to the eager step when capture "
        "fails (and says so); on stops with the error instead (a fallback would only measure the eager step again)",
    )
    p.add_argument(
        "--profile", type=int, metavar="N", help="also the step table over N steps (on CPU: a smoke run of it)"
    )
    p.add_argument(
        "--profile-paths",
        nargs="+",
        choices=PROFILE_PATHS,
        help="--profile: its rows (default: fast and eager, and compiled when --paths has it)",
    )
    p.add_argument("--cpu-table", action="store_true", help="only the CPU table (2 gloo ranks: eager, flat, ddp)")
    p.add_argument("--steps", type=int, default=60, help="--cpu-table: steps per run")
    p.add_argument("--ranks", type=int, default=2, help="--cpu-table: ranks")
    p.add_argument("--repeats", type=int, default=2, help="--cpu-table: runs of each step, alternating")
    p.add_argument("--output", help="also write the figures as JSON here")
    p.add_argument(
        "--report", nargs="+", type=Path, metavar="JSON", help="only print the tables of saved --output files"
    )
    args = p.parse_args()
    if args.report:
        print_report(args.report)
        return
    spec = closed_1a(args.data, args.max_epochs, args.subset, args.target)
    if args.cpu_table:
        cpu_table(spec, args.steps, args.ranks, args.repeats)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU visible (use --device cpu for the smoke mode)")
    results: dict[str, dict[str, object]] = {}
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    profile: dict[str, dict[str, Any]] = {}
    base = base_options(args.bf16, bool(args.cudnn_benchmark), bool(args.process_group), args.fast_path)

    def saved() -> dict[str, Any]:
        """What is measured so far, as ``--output`` holds it and ``--report`` reads it."""
        return {"device": name, "args": vars(args), "results": results, "profile": profile}

    def save() -> None:
        """Write what is measured so far: a run cut short by the device's time limit keeps its figures."""
        if args.output:  # whole or not at all: the stage may be stopped at any moment
            part = Path(args.output + ".part")
            part.write_text(json.dumps(saved(), indent=2))
            part.replace(args.output)

    with tempfile.TemporaryDirectory() as tmp:
        for path in args.paths:
            algorithm = "ddp" if path == "ddp" else "allreduce-sgd"
            config = make_config(spec, args.device, str(Path(tmp) / path), algorithm, args.seed)
            if path == "plain":
                results[path] = run_plain(config, device, args.workers, bool(args.cudnn_benchmark))
            else:
                results[path] = run_runner(config, runner_options(base, path))
            print(f"{path}:", json.dumps(results[path]), flush=True)
            save()
        if args.profile:
            profile = step_profile(
                make_config(spec, args.device, str(Path(tmp) / "profile")),
                base,
                args.profile,
                Path(tmp),
                args.profile_paths or [p for p in PROFILE_PATHS if p in ("fast", "eager", *args.paths)],
            )
            save()
            if torch.distributed.is_initialized():  # the nccl group the profile's set-ups shared
                torch.distributed.destroy_process_group()
    print_results(saved())


if __name__ == "__main__":
    main()
