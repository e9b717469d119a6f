"""Task 1a time-to-80 % on one GPU under the closed-division rules, two ways, one run.

1. ``runner``: mlbench_runner's Trainer (data as uint8 tensors on the GPU, batch-level
   augmentation on the GPU, fp32 unless ``--bf16``).
2. ``plain``: the same recipe written the usual way: a per-sample ``Dataset`` doing
   pad/crop/flip/normalise in numpy, a ``DataLoader`` (shuffle, workers, pinned memory),
   eager fp32 (what torchvision's CIFAR10 + transforms would do; torchvision itself is
   not needed).

Closed-division 1a recipe with k = 1: ResNet-20 m1, batch 32, lr 0.1/256 x 32, momentum
0.9 Nesterov, weight decay 1e-4, x0.1 at epochs 82 and 109, at most 164 epochs; the
clock starts before the data is loaded and includes every per-epoch test evaluation.
Data: the JPEG copy of CIFAR-10 (decoded once into the runner's cache; that one-time
decode is left out of both paths' clocks, as in the runner).

Both paths are compared on the same kind of time, host wall clock with the GPU
synchronised at the epoch boundaries: ``wall s/epoch (train)`` is an epoch's training
steps, ``wall s/epoch (+eval)`` adds its test evaluation, and ``time-to-goal`` is wall clock
from before data loading to the end of the evaluation that met the target. The runner's
``trainSeconds`` (the sum of its CUDA-event phase times: *device* time, which leaves out
host gaps between kernels) is shown separately as ``device s/epoch``.

    python benchmarks/runner_gpu_time_to_accuracy.py                       # on a GPU machine
    python benchmarks/runner_gpu_time_to_accuracy.py --device cpu --max-epochs 1 --subset 512   # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mlbench_api import BenchmarkRun, BenchmarkTaskSpec, RunConfig
from mlbench_api.config import effective_config
from mlbench_runner.data import load_dataset
from mlbench_runner.models import CifarResNet
from mlbench_runner.recipes import catalog_recipe, shared_cifar10
from mlbench_runner.schedule import learning_rate
from mlbench_runner.train import Options, Trainer
from mlbench_runner.world import World


def closed_1a(data: str, max_epochs: int, subset: int | None, target: float) -> BenchmarkTaskSpec:
    """The catalog's task 1a, read from the JPEG tarball; shorter only in smoke mode."""
    return catalog_recipe("cifar10-resnet20", data=data, train_subset=subset, max_epochs=max_epochs, target=target)


def make_config(spec: BenchmarkTaskSpec, device: str, out: str) -> RunConfig:
    gpu = device == "cuda"
    run = BenchmarkRun.model_validate(
        {
            "metadata": {"name": "tta-1a"},
            "spec": {
                "taskRef": {"name": "cifar10-resnet20"},
                "workers": 1,
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


def run_fast(config: RunConfig, bf16: bool) -> dict[str, object]:
    opts = Options(precision="bf16" if bf16 else "fp32", channels_last=bf16)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        summary = Trainer(config, World(0, 1, 0, 1, "127.0.0.1", 0, "single"), opts).run()
    assert summary is not None
    # The trainer waits for every CUDA event at each epoch end and the evaluation ends in a
    # host read of the counts, so these event times are synchronised wall clock.
    walls = epoch_walls(Path(config.output_dir) / "events.jsonl")
    evaluated = max(len(walls), 1)
    eval_s = summary.phases.evaluation
    return {
        "time_to_goal_s": summary.time_to_goal_seconds,
        "wall_s": summary.wall_clock_seconds,
        "epochs": summary.epochs,
        "best_accuracy": summary.best_accuracy,
        "eval_s": eval_s,
        "wall_s_per_epoch": sum(walls) / evaluated,
        "wall_train_s_per_epoch": (sum(walls) - eval_s) / evaluated,
        "device_train_s_per_epoch": summary.train_seconds / max(summary.epochs, 1e-9),
    }


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


def run_plain(config: RunConfig, device: torch.device, workers: int) -> dict[str, object]:
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-epochs", type=int, default=164)
    p.add_argument("--subset", type=int, help="train on the first N images (smoke runs; not closed division)")
    p.add_argument("--target", type=float, default=0.80)
    p.add_argument("--data", default=str(shared_cifar10()))
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers for the plain path")
    p.add_argument("--bf16", action="store_true", help="runner path with bf16 autocast + channels_last (open div.)")
    p.add_argument("--only", choices=("runner", "plain"))
    p.add_argument("--output", help="also write the figures as JSON here")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU visible (use --device cpu for the smoke mode)")
    spec = closed_1a(args.data, args.max_epochs, args.subset, args.target)
    results: dict[str, dict[str, object]] = {}
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        config = make_config(spec, args.device, tmp)
        if args.only in (None, "runner"):
            results["runner"] = run_fast(config, args.bf16)
            print("runner:", json.dumps(results["runner"]), flush=True)
        if args.only in (None, "plain"):
            results["plain"] = run_plain(config, device, args.workers)
            print("plain: ", json.dumps(results["plain"]), flush=True)
    print(
        f"\n# task 1a closed recipe (k=1, b=32), target {args.target:.0%}, device {name}, data: JPEG copy of "
        f"CIFAR-10{f', first {args.subset} train images' if args.subset else ''}, max {args.max_epochs} epochs"
    )
    print(
        f"{'path':8} {'time-to-goal':>13} {'wall':>8} {'epochs':>7} {'best acc':>9} {'wall s/epoch (train)':>21} "
        f"{'wall s/epoch (+eval)':>21} {'device s/epoch':>15}"
    )
    for path, r in results.items():
        ttg = f"{r['time_to_goal_s']:.1f}s" if r["time_to_goal_s"] is not None else "not reached"
        dev = r["device_train_s_per_epoch"]
        print(
            f"{path:8} {ttg:>13} {float(r['wall_s']):>7.1f}s {float(r['epochs']):>7.0f} "  # type: ignore[arg-type]
            f"{100 * float(r['best_accuracy'] or 0):>8.2f}% "  # type: ignore[arg-type]
            f"{float(r['wall_train_s_per_epoch']):>21.2f} {float(r['wall_s_per_epoch']):>21.2f} "  # type: ignore[arg-type]
            f"{'-' if dev is None else f'{float(dev):.2f}':>15}"  # type: ignore[arg-type]
        )
    print("wall = synchronised host wall clock (same kind for both paths); device = runner's CUDA-event time")
    if args.output:
        Path(args.output).write_text(json.dumps({"device": name, "args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
