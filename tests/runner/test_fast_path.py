"""The fast training step computes the eager reference's update, step for step (CPU, fp64).

On CPU the fast step is the flat one (CUDA graphs need a GPU): parameters and gradients in
one flat buffer each and the SGD update written out over them. The GPU capture itself is
checked at run time against the same code run eagerly (``FastStep.verify``) and measured
by benchmarks/runner_gpu_time_to_accuracy.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mlbench_api.config import RunConfig
from mlbench_api.results import RunSummary
from mlbench_runner.algorithms import make_algorithm
from mlbench_runner.comm import LocalCommunicator, TorchCommunicator
from mlbench_runner.data import TensorDataset
from mlbench_runner.flat import FlatParameters, FlatSGD, dense_view
from mlbench_runner.options import Options
from mlbench_runner.rank import setup as rank_setup
from mlbench_runner.rank.models import CifarResNet
from mlbench_runner.rank.steps import EagerStep, FastStep, PathChoice, StepPath, choose_path, compile_wanted
from mlbench_runner.rank.tasks import ImageClassification
from mlbench_runner.rank.train import Trainer, status_for
from mlbench_runner.timing import PhaseTimer
from mlbench_runner.world import World

from .helpers import join_all, launch_processes, logreg_task, make_config, resnet_task, spawn_ranks, write_cifar_python

SINGLE = World(0, 1, 0, 1, "127.0.0.1", 0, "single")

# -- which step runs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "algorithm", "optimizer", "device", "path"),
    [
        ("auto", "allreduce-sgd", "sgd", "cpu", StepPath.FLAT),
        ("auto", "allreduce-sgd", "sgd", "cuda", StepPath.CUDA_GRAPHS),
        ("on", "allreduce-sgd", "sgd", "cuda", StepPath.CUDA_GRAPHS),
        ("off", "allreduce-sgd", "sgd", "cuda", StepPath.EAGER),
        ("auto", "ddp", "sgd", "cuda", StepPath.EAGER),
        ("auto", "powersgd", "sgd", "cpu", StepPath.EAGER),
        ("auto", "allreduce-sgd", "adam", "cuda", StepPath.EAGER),
        ("off", "powersgd", "sgd", "cpu", StepPath.EAGER),
    ],
)
def test_choose_path(requested: str, algorithm: str, optimizer: str, device: str, path: StepPath) -> None:
    choice = choose_path(requested, algorithm, optimizer, device)
    assert choice.path is path
    assert choice.reason
    if path is StepPath.EAGER and requested == "auto":
        assert algorithm in choice.reason or optimizer in choice.reason


@pytest.mark.parametrize(
    ("setting", "path", "compiled"),
    [
        ("auto", StepPath.CUDA_GRAPHS, True),  # measured faster on an H100
        ("auto", StepPath.FLAT, False),  # not measured faster on CPU
        ("auto", StepPath.EAGER, False),  # the reference step is never compiled
        ("1", StepPath.FLAT, True),
        ("1", StepPath.CUDA_GRAPHS, True),
        ("1", StepPath.EAGER, False),
        ("0", StepPath.CUDA_GRAPHS, False),
        ("0", StepPath.FLAT, False),
    ],
)
def test_compile_wanted(setting: str, path: StepPath, compiled: bool) -> None:
    assert compile_wanted(setting, path) is compiled


@pytest.mark.parametrize(("algorithm", "optimizer"), [("decentralized-sgd", "sgd"), ("allreduce-sgd", "adam")])
def test_fast_path_on_where_it_cannot_apply_names_the_knob(algorithm: str, optimizer: str) -> None:
    with pytest.raises(ValueError, match=r"MLBENCH_FAST_PATH: on, but .*" + algorithm):
        choose_path("on", algorithm, optimizer, "cpu")


@pytest.mark.parametrize(
    ("reason", "reached", "status"),
    [
        ("goal", True, "success"),
        ("diverged", False, "aborted"),
        ("max-steps", False, "goal-not-reached"),
        ("max-epochs", False, "goal-not-reached"),
        ("max-epochs", True, "success"),  # accuracy-after-time: the last evaluation meets the target
        ("time-budget", True, "success"),
        ("time-budget", False, "goal-not-reached"),
    ],
)
def test_status_for(reason: str, reached: bool, status: str) -> None:
    assert status_for(reason, reached) == status  # type: ignore[arg-type]


# -- the flat buffers and the update -----------------------------------------------------------


@pytest.mark.parametrize(
    ("momentum", "nesterov", "weight_decay"),
    [(0.9, True, 1e-4), (0.9, False, 1e-4), (0.0, False, 1e-3), (0.0, False, 0.0), (0.5, True, 0.0)],
)
def test_flat_sgd_is_torch_sgd(momentum: float, nesterov: bool, weight_decay: float) -> None:
    gen = torch.Generator().manual_seed(1)
    shapes = [(16, 3, 3, 3), (16,), (10, 64), (10,)]
    torch_params = [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]
    flat_p = torch.cat([p.detach().reshape(-1) for p in torch_params])
    flat_g = torch.zeros_like(flat_p)
    ref = torch.optim.SGD(torch_params, lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    sgd = FlatSGD(flat_p, flat_g, 0.1, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    for step, lr in enumerate([0.1, 0.05, 0.2, 0.01, 0.3, 0.3, 0.001, 0.1]):
        grads = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
        for p, g in zip(torch_params, grads, strict=True):
            p.grad = g.clone()
        flat_g.copy_(torch.cat([g.reshape(-1) for g in grads]))
        for group in ref.param_groups:
            group["lr"] = lr
        ref.step()
        sgd.set_lr(lr)
        sgd.step()
        expected = torch.cat([p.detach().reshape(-1) for p in torch_params])
        torch.testing.assert_close(flat_p, expected, rtol=1e-14, atol=1e-15, msg=f"step {step}")
        assert torch.count_nonzero(flat_g) == 0, "the step leaves the gradients zeroed for the next backward"


def test_flat_parameters_keep_values_layout_and_autograd() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.LazyLinear(4))
    model(torch.randn(2, 3, 8, 8))
    model = model.to(memory_format=torch.channels_last)
    before = [(p.detach().clone(), p.stride()) for p in model.parameters()]
    flat = FlatParameters(model)
    base = flat.flat.data_ptr()
    end = base + flat.flat.numel() * flat.flat.element_size()
    for p, (value, stride) in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), value)
        assert p.stride() == stride, "a channels_last weight stays channels_last"
        assert base <= p.data_ptr() < end
    flat.flat.add_(1.0)  # writing the buffer writes the model
    assert torch.equal(next(iter(model.parameters())).detach(), before[0][0] + 1)
    model(torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_dense_view_refuses_a_strided_tensor() -> None:
    with pytest.raises(ValueError, match="dense"):
        dense_view(torch.zeros(12), 0, torch.zeros(4, 6)[:, ::2])


# -- one model, two steps: eager and flat, step for step ----------------------------------------


def _image_data(n_train: int = 48, n_test: int = 8) -> TensorDataset:
    rng = np.random.default_rng(0)
    return TensorDataset(
        kind="image",
        x_train=rng.integers(0, 256, (n_train, 3, 32, 32), dtype=np.uint8),
        y_train=rng.integers(0, 10, n_train),
        x_test=rng.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8),
        y_test=rng.integers(0, 10, n_test),
        mean=(125.0, 123.0, 114.0),
        std=(63.0, 62.0, 66.0),
    )


@pytest.mark.parametrize(
    ("logits", "loss", "rtol"),
    [
        (torch.float64, torch.float64, 1e-15),
        (torch.float32, torch.float32, 1e-6),
        (torch.bfloat16, torch.float32, 1e-2),
    ],
)
def test_the_image_loss_is_taken_in_the_logits_precision_at_least_fp32(
    logits: torch.dtype, loss: torch.dtype, rtol: float
) -> None:
    """bf16 autocast's logits are lifted to fp32 for the loss; fp64 (the equivalence tests) is not cut to fp32."""
    kernel = ImageClassification(_image_data(), torch.device("cpu"), torch.float64, torch.Generator().manual_seed(5))
    output = torch.randn(4, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    target = torch.arange(4)
    value = kernel.loss(output.to(logits), target, nn.Identity())
    assert value.dtype == loss
    torch.testing.assert_close(value.double(), F.cross_entropy(output, target), rtol=rtol, atol=0)


def _rig(fast: bool, compile: bool = False) -> tuple[nn.Module, EagerStep | FastStep]:
    """ResNet-20, fp64, the closed-division update; the same seeds for both paths."""
    torch.manual_seed(0)
    device, dtype = torch.device("cpu"), torch.float64
    kernel = ImageClassification(_image_data(), device, dtype, torch.Generator().manual_seed(5))
    model: nn.Module = CifarResNet(20, "m1").to(device, dtype)
    algorithm = make_algorithm("allreduce-sgd", LocalCommunicator("gloo"))
    model = algorithm.prepare(model)
    timer = PhaseTimer(device)
    sgd = (0.1, 0.9, True, 1e-4)
    if fast:
        grads = algorithm.grads  # type: ignore[attr-defined]
        return model, FastStep(
            kernel, model, algorithm, grads=grads, sgd_options=sgd, timer=timer, autocast=False, compile=compile
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    return model, EagerStep(kernel, model, algorithm, optimizer=optimizer, timer=timer, autocast=False)


@pytest.mark.multiproc
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("compiled", "buffer_atol"),
    [
        (False, 1e-14),
        # torch.compile fuses BatchNorm's reductions, which round differently: measured 3e-14 on a running mean
        (True, 1e-12),
    ],
    ids=["flat", "flat+torch.compile"],
)
def test_flat_step_matches_eager_step_for_step_resnet20_fp64(compiled: bool, buffer_atol: float) -> None:
    """The flat step, and the same with its model through torch.compile (MLBENCH_COMPILE), is the eager one."""
    tolerance = 1e-12  # fp64 round-off; measured on parameters: 0 (flat), 6e-14 after 6 steps (compiled)
    eager_model, eager = _rig(fast=False)
    fast_model, fast = _rig(fast=True, compile=compiled)
    assert fast.path is StepPath.FLAT
    lrs = [0.01, 0.05, 0.1, 0.1, 0.01, 0.001]  # warm-up, plateau, decays: the rate changes between steps
    for step, lr in enumerate(lrs):
        idx = torch.arange(step * 8, (step + 1) * 8) % 48
        loss_e, loss_f = eager(step, idx, lr), fast(step, idx, lr)
        torch.testing.assert_close(loss_f, loss_e, rtol=tolerance, atol=0)
        worst = max(
            float((pf - pe).detach().abs().max())
            for pf, pe in zip(fast_model.parameters(), eager_model.parameters(), strict=True)
        )
        assert worst < tolerance, f"step {step}: parameters differ by {worst}"
        for bf, be in zip(fast_model.buffers(), eager_model.buffers(), strict=True):
            torch.testing.assert_close(bf, be, rtol=tolerance, atol=buffer_atol)
    start = _rig(fast=False)[0].parameters()
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(fast_model.parameters(), start, strict=True))
    assert moved > 1e-3, "the steps really trained"


def test_flat_step_times_the_same_phases() -> None:
    _, fast = _rig(fast=True)
    timer = fast.timer
    for step in range(3):
        fast(step, torch.arange(8), 0.1)
    steps = timer.flush(wait=True)
    assert [s.step for s in steps] == [0, 1, 2]
    assert {"data", "forward", "backward", "optimizer"} <= set(steps[0].phases)
    assert all(v > 0 for v in steps[0].phases.values())


# -- real ranks (gloo): the runner's two paths, step for step --------------------------------------


@pytest.mark.multiproc
def test_two_ranks_fast_and_eager_agree_logreg(tmp_path: Path) -> None:
    task = logreg_task(batch=5, epochs=2, train=200, features=12, alpha=3.0)
    paths = {}
    for mode in ("off", "on"):
        config = make_config(task, tmp_path / mode, 2)
        recs = launch_processes(config, 2, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64", MLBENCH_FAST_PATH=mode)
        assert recs[0]["param_sha1"] == recs[1]["param_sha1"], "ranks diverged"
        paths[mode] = np.asarray(recs[0]["param_values"])
        summary = RunSummary.model_validate_json((tmp_path / mode / "summary.json").read_text())
        assert summary.environment.training_step == ("eager" if mode == "off" else "flat")
    assert paths["off"].shape == (2 * 200 // 10, 12)
    assert np.abs(paths["off"]).max() > 0.1
    np.testing.assert_allclose(paths["on"], paths["off"], rtol=1e-12, atol=1e-14)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_two_ranks_fast_and_eager_agree_resnet(tmp_path: Path) -> None:
    data = write_cifar_python(tmp_path, n_train=80, n_test=20)
    task = resnet_task(data, batch=8, epochs=2, subset=64, warmup=1, milestones=[1])
    norms = {}
    for mode in ("off", "auto"):
        config = make_config(task, tmp_path / mode, 2)
        recs = launch_processes(config, 2, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64", MLBENCH_FAST_PATH=mode)
        assert recs[0]["param_sha1"] == recs[1]["param_sha1"], "ranks diverged"
        norms[mode] = np.asarray(recs[0]["param_norms"])
    assert len(norms["off"]) == 2 * 64 // 16
    assert len(set(norms["off"].tolist())) == len(norms["off"]), "the parameters changed every step"
    np.testing.assert_allclose(norms["auto"], norms["off"], rtol=1e-12)


# -- a capture that fails, or does not check out, falls back (auto) or stops (on) ----------------------


def _single_rank_config(tmp_path: Path) -> RunConfig:
    return make_config(logreg_task(batch=10, epochs=1, train=100, features=8), tmp_path / "out", 1)


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("capture", "verify", "why"),
    [
        (RuntimeError("operation not permitted when stream is capturing"), 0.0, "not permitted when stream"),
        (None, 0.5, "differs from the eager one by 0.5"),
        (None, float("nan"), "differs from the eager one by nan"),
    ],
)
def test_graph_capture_failure_falls_back_to_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capture: Exception | None, verify: float, why: str
) -> None:
    """The glue around capture, driven on CPU: a GPU where capturing raises or replays wrongly."""

    def fake_capture(self: FastStep, x: torch.Tensor, y: torch.Tensor) -> float:
        if capture is not None:
            raise capture
        return 0.25

    monkeypatch.setattr(rank_setup, "choose_path", lambda *a: PathChoice(StepPath.CUDA_GRAPHS, "test: a GPU"))
    monkeypatch.setattr(FastStep, "capture", fake_capture)
    monkeypatch.setattr(FastStep, "verify", lambda self, x, y, lr: verify)
    summary = Trainer(_single_rank_config(tmp_path), SINGLE, Options(max_steps=3, compile="0")).run()
    assert summary is not None
    assert summary.environment.training_step == "eager"
    assert why in (summary.environment.training_step_reason or "")
    assert summary.steps == 3
    events = (tmp_path / "out" / "events.jsonl").read_text()
    assert '"fast_path_fallback"' in events

    monkeypatch.setattr(FastStep, "verify", lambda self, x, y, lr: verify)
    with pytest.raises(RuntimeError, match=why.split(" by ", maxsplit=1)[0]):
        Trainer(_single_rank_config(tmp_path / "on"), SINGLE, Options(max_steps=3, fast_path="on", compile="0")).run()


@pytest.mark.multiproc
def test_a_checked_capture_is_used_and_its_time_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_setup, "choose_path", lambda *a: PathChoice(StepPath.CUDA_GRAPHS, "test: a GPU"))

    def fake_capture(self: FastStep, x: torch.Tensor, y: torch.Tensor) -> float:
        time.sleep(0.2)
        return 0.2

    def fake_verify(self: FastStep, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
        time.sleep(0.3)  # the check's eager step can compile too (torch.compile)
        return 1e-7

    monkeypatch.setattr(FastStep, "capture", fake_capture)
    monkeypatch.setattr(FastStep, "verify", fake_verify)
    trainer = Trainer(_single_rank_config(tmp_path), SINGLE, Options(max_steps=3, compile="0"))
    start = trainer.clock.start
    summary = trainer.run()
    assert summary is not None
    assert summary.environment.training_step == "flat"  # no graphs were really made: the flat step ran them
    capture_seconds = summary.environment.capture_seconds
    assert capture_seconds is not None
    assert 0.5 <= capture_seconds < 2  # at least the capture's and its check's sleeps
    assert trainer.clock.start == pytest.approx(start + capture_seconds, abs=1e-3), (
        "capture and its check are initialisation, outside the clock"
    )
    assert summary.wall_clock_seconds > 0


@pytest.mark.multiproc
def test_one_rank_with_a_process_group_runs_its_collectives_through_the_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLBENCH_PROCESS_GROUP=1: world size 1 still all-reduces its gradients through gloo (on a GPU: nccl),
    every step (what the GPU benchmark's nccl row claims to time), with the same result."""
    reduced: list[int] = []  # the sizes of the tensors all-reduced through the backend
    real_all_reduce = torch.distributed.all_reduce

    def spy(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        reduced.append(tensor.numel())
        return real_all_reduce(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.distributed, "all_reduce", spy)
    runs = {}
    for process_group in (False, True):
        trainer = Trainer(
            _single_rank_config(tmp_path / str(process_group)),
            SINGLE,
            Options(max_steps=5, trace_params=True, process_group=process_group),
        )
        runs[process_group] = (trainer, trainer.run())
    alone, grouped = runs[False], runs[True]
    assert isinstance(alone[0].comm, LocalCommunicator)
    assert isinstance(grouped[0].comm, TorchCommunicator)
    assert not torch.distributed.is_initialized(), "the run closes its process group"
    assert alone[1] is not None
    assert grouped[1] is not None
    assert grouped[1].environment.training_step == alone[1].environment.training_step == "flat"
    assert grouped[1].steps == alone[1].steps == 5
    assert grouped[0].record.param_sha1 == alone[0].record.param_sha1  # an all-reduce over one rank changes nothing
    assert grouped[0].setup is not None
    parameters = sum(p.numel() for p in grouped[0].setup.model.parameters())
    assert reduced.count(parameters) == 5, reduced  # the gradients, once per step (none without the group)
    # and the summary declares what was sent: an all-reduce of the gradients with the group, nothing alone
    plans = {g: r.communication for g, (_, r) in runs.items() if r is not None}
    declared = {g: (c.collectives, c.bytes_per_step) for g, c in plans.items() if c is not None}
    assert declared == {False: ([], 0), True: (["all-reduce"], parameters * 4)}


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_compiled_fast_step_is_compiled_outside_the_clock_and_computes_the_same(tmp_path: Path) -> None:
    """MLBENCH_COMPILE=1 (CPU: the flat step): torch.compile's model, compiled on a synthetic batch before
    the clock runs, gives the uncompiled flat step's parameters after every step (fp64, to round-off)."""
    runs = {}
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]
    for compiled in (False, True):
        before = graphs["unique_graphs"]
        trainer = Trainer(
            _single_rank_config(tmp_path / str(compiled)),
            SINGLE,
            Options(dtype=torch.float64, max_steps=5, trace_params=True, compile="1" if compiled else "0"),
        )
        start = trainer.clock.start
        summary = trainer.run()
        assert summary is not None
        assert (graphs["unique_graphs"] > before) is compiled, "only MLBENCH_COMPILE=1 compiles"
        runs[compiled] = (trainer, summary, start)
    (flat, flat_summary, _), (comp, comp_summary, comp_start) = runs[False], runs[True]
    assert flat_summary.environment.training_step == comp_summary.environment.training_step == "flat"
    assert flat_summary.environment.compiled is False
    assert flat_summary.environment.capture_seconds is None
    assert comp_summary.environment.compiled is True
    assert comp.setup is not None
    assert isinstance(comp.setup.step, FastStep)
    assert comp.setup.step.net is not comp.setup.model, "the step runs the compiled wrapper"
    compile_seconds = comp_summary.environment.capture_seconds
    assert compile_seconds is not None
    assert compile_seconds > 0
    assert comp.clock.start == pytest.approx(comp_start + compile_seconds), "compiling is initialisation"
    assert len(comp.record.param_values) == len(flat.record.param_values) == 5
    np.testing.assert_allclose(comp.record.param_values, flat.record.param_values, rtol=1e-10, atol=1e-12)
    assert comp.record.param_values[0] != comp.record.param_values[-1], "the parameters moved"


@pytest.mark.multiproc
@pytest.mark.parametrize("path", [StepPath.FLAT, StepPath.CUDA_GRAPHS])
def test_torch_compile_s_own_start_is_left_out_of_the_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: StepPath
) -> None:
    """``torch.compile(model)`` imports its compiler stack before anything is compiled (about 2 s on CPU; an H100
    run had 8 s in its clock outside its epochs): initialisation, left out with the warm-up or the capture."""

    def slow_compile(model: torch.nn.Module, **_: object) -> torch.nn.Module:
        time.sleep(0.4)
        return model

    def prepare(self: FastStep, x: torch.Tensor, y: torch.Tensor) -> float:
        time.sleep(0.1)
        return 0.1

    monkeypatch.setattr(torch, "compile", slow_compile)
    monkeypatch.setattr(rank_setup, "choose_path", lambda *a: PathChoice(path, "test"))
    monkeypatch.setattr(FastStep, "warm_up", prepare)
    monkeypatch.setattr(FastStep, "capture", prepare)
    monkeypatch.setattr(FastStep, "verify", lambda self, x, y, lr: 1e-7)
    trainer = Trainer(_single_rank_config(tmp_path), SINGLE, Options(max_steps=3, compile="1"))
    start = trainer.clock.start
    summary = trainer.run()
    assert summary is not None
    seconds = summary.environment.capture_seconds
    assert seconds is not None
    assert seconds >= 0.5  # the wrapper's 0.4 s and the 0.1 s of warm-up or capture
    assert trainer.clock.start == pytest.approx(start + seconds, abs=1e-3), "all of it outside the clock"


@pytest.mark.multiproc
def test_a_capture_that_fails_is_left_out_of_the_clock_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fallback to the eager step: the attempt (torch.compile's wrapper, the capture's warm-up, which holds
    the whole compile) ran on synthetic batches, and is not the eager step's time."""

    def slow_compile(model: torch.nn.Module, **_: object) -> torch.nn.Module:
        time.sleep(0.2)
        return model

    def failing_capture(self: FastStep, x: torch.Tensor, y: torch.Tensor) -> float:
        time.sleep(0.3)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch, "compile", slow_compile)
    monkeypatch.setattr(rank_setup, "choose_path", lambda *a: PathChoice(StepPath.CUDA_GRAPHS, "test: a GPU"))
    monkeypatch.setattr(FastStep, "capture", failing_capture)
    trainer = Trainer(_single_rank_config(tmp_path), SINGLE, Options(max_steps=3, compile="1"))
    start = trainer.clock.start
    summary = trainer.run()
    assert summary is not None
    assert summary.environment.training_step == "eager"
    assert summary.environment.capture_seconds is None  # no fast step ran
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    (fallback,) = [e for e in events if e["event"] == "fast_path_fallback"]
    assert 0.5 <= fallback["attempt_s"] < 2
    assert trainer.clock.start == pytest.approx(start + fallback["attempt_s"], abs=2e-3)


class _Compiled(nn.Module):
    """Stands in for torch.compile's wrapper: runs the model it wraps (no compiler on a CPU test)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def _compile_fails_on_capture(monkeypatch: pytest.MonkeyPatch, calls: list[bool]) -> None:
    """A GPU where torch.compile's attempt fails in the capture (as inductor does without a C compiler) and
    the captured step without it succeeds; ``calls`` gets each capture's ``compiled``."""

    def fake_capture(self: FastStep, x: torch.Tensor, y: torch.Tensor) -> float:
        calls.append(self.compiled)
        if self.compiled:
            raise RuntimeError("backend='inductor' raised:\nInvalidCxxCompiler: No working C++ compiler found")
        return 0.25

    monkeypatch.setattr(torch, "compile", lambda model, **_: _Compiled(model))
    monkeypatch.setattr(rank_setup, "choose_path", lambda *a: PathChoice(StepPath.CUDA_GRAPHS, "test: a GPU"))
    monkeypatch.setattr(FastStep, "capture", fake_capture)
    monkeypatch.setattr(FastStep, "verify", lambda self, x, y, lr: 1e-7)


@pytest.mark.multiproc
def test_auto_compile_that_fails_falls_back_to_the_captured_step_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLBENCH_COMPILE=auto (the default) compiles the GPU's captured step; when that attempt fails (a runner
    image without a C compiler for Triton), the graphs without torch.compile run, not the eager step."""
    calls: list[bool] = []
    _compile_fails_on_capture(monkeypatch, calls)
    trainer = Trainer(_single_rank_config(tmp_path), SINGLE, Options(max_steps=3))
    summary = trainer.run()
    assert summary is not None
    assert calls == [True, False], "a compiled capture, then one without torch.compile"
    env = summary.environment
    assert env.training_step == "flat"  # the fake capture made no graphs: the uncompiled fast step ran
    assert env.compiled is False
    reason = env.training_step_reason or ""
    assert rank_setup.COMPILE_DROPPED in reason
    assert "InvalidCxxCompiler: No working C++ compiler found" in reason
    assert "\n" not in reason, "one line"
    assert trainer.setup is not None
    assert isinstance(trainer.setup.step, FastStep)
    assert trainer.setup.step.net is trainer.setup.model, "the model itself, not the failed wrapper"
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] in ("compile_fallback", "fast_path", "fast_path_fallback")] == [
        "compile_fallback",
        "fast_path",
    ]
    assert summary.steps == 3


@pytest.mark.parametrize(
    ("setting", "compiled", "succeeded", "retry"),
    [
        ("auto", True, False, True),
        ("auto", True, True, False),
        ("auto", False, False, False),  # already without it (or never compiled): the eager step next
        ("1", True, False, False),  # the user asked for torch.compile: its failure is the capture's
        ("0", False, False, False),
    ],
)
def test_retry_without_compile(setting: str, compiled: bool, succeeded: bool, retry: bool) -> None:
    assert rank_setup.retry_without_compile(setting, compiled, succeeded=succeeded) is retry


def test_a_model_torch_compile_cannot_wrap_fails_where_it_is_first_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unsupported platform: torch.compile raises at once. The step keeps the error for its warm-up or capture,
    inside the caller's fallback and the ranks' vote, and runs the model itself once the compile is dropped."""

    def unsupported(model: nn.Module, **_: object) -> nn.Module:
        raise RuntimeError("Dynamo is not supported on this Python")

    monkeypatch.setattr(torch, "compile", unsupported)
    model, fast = _rig(fast=True, compile=True)
    assert isinstance(fast, FastStep)
    assert fast.compiled
    assert fast.net is model
    x, y = fast.kernel.synthetic_batch(4, seed=1)
    with pytest.raises(RuntimeError, match=r"torch\.compile failed: Dynamo is not supported"):
        fast.warm_up(x, y)
    fast.drop_compile()
    assert fast.warm_up(x, y) > 0


@pytest.mark.multiproc
def test_auto_compile_that_cannot_wrap_falls_back_to_the_captured_step_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(model: nn.Module, **_: object) -> nn.Module:
        raise RuntimeError("Dynamo is not supported on this Python")

    def fake_capture(self: FastStep, x: torch.Tensor, y: torch.Tensor) -> float:
        self._check_compiled()  # where the real capture starts
        return 0.25

    monkeypatch.setattr(torch, "compile", unsupported)
    monkeypatch.setattr(rank_setup, "choose_path", lambda *a: PathChoice(StepPath.CUDA_GRAPHS, "test: a GPU"))
    monkeypatch.setattr(FastStep, "capture", fake_capture)
    monkeypatch.setattr(FastStep, "verify", lambda self, x, y, lr: 1e-7)
    summary = Trainer(_single_rank_config(tmp_path), SINGLE, Options(max_steps=3)).run()
    assert summary is not None
    assert summary.environment.compiled is False
    assert "torch.compile failed: Dynamo is not supported" in (summary.environment.training_step_reason or "")
    assert summary.environment.training_step == "flat"  # the fake capture made no graphs


@pytest.mark.multiproc
def test_an_explicit_compile_that_fails_is_a_failed_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLBENCH_COMPILE=1 asked for torch.compile: its failure is the capture's (eager, or an error with
    MLBENCH_FAST_PATH=on), never a silent run without it."""
    calls: list[bool] = []
    _compile_fails_on_capture(monkeypatch, calls)
    summary = Trainer(_single_rank_config(tmp_path), SINGLE, Options(max_steps=3, compile="1")).run()
    assert summary is not None
    assert calls == [True]
    assert summary.environment.training_step == "eager"
    assert "InvalidCxxCompiler" in (summary.environment.training_step_reason or "")
    with pytest.raises(RuntimeError, match="InvalidCxxCompiler"):
        Trainer(_single_rank_config(tmp_path / "on"), SINGLE, Options(max_steps=3, compile="1", fast_path="on")).run()


@pytest.mark.parametrize(
    ("error", "limit", "expected"),
    [
        (RuntimeError("boom"), 300, "RuntimeError: boom"),
        (RuntimeError("a\n  b\n\nc"), 300, "RuntimeError: a b c"),
        (ValueError("x" * 50), 20, "ValueError: xxxxxxx…"),
    ],
)
def test_brief_error(error: Exception, limit: int, expected: str) -> None:
    assert rank_setup.brief_error(error, limit) == expected
    assert len(rank_setup.brief_error(error, limit)) <= limit


def _rank_whose_compile_may_fail(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks in a spawned process: rank 1's compiled capture raises, every other capture passes."""

    def fake_capture(self: FastStep, x: torch.Tensor, y: torch.Tensor) -> float:
        if rank == 1 and self.compiled:
            raise RuntimeError("rank 1: compile refused")
        return 0.25

    torch.compile = lambda model, **_: _Compiled(model)  # type: ignore[assignment]
    rank_setup.choose_path = lambda *a: PathChoice(StepPath.CUDA_GRAPHS, "test: a GPU")
    FastStep.capture = fake_capture  # type: ignore[method-assign]
    FastStep.verify = lambda self, x, y, lr: 0.0  # type: ignore[method-assign]
    config = RunConfig.model_validate_json((Path(out) / "config.json").read_text())
    world = World(rank, 2, rank, 2, "127.0.0.1", port, "env")
    Trainer(config, world, Options(max_steps=3)).run()


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_a_compile_failing_on_one_rank_drops_it_on_every_rank(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Ranks never run different steps: when one rank's torch.compile attempt fails, every rank captures again
    without it (the vote's answer), and the run takes the fast step, not the eager one."""
    config = make_config(logreg_task(batch=10, epochs=1, train=100, features=8), tmp_path, 2)
    (tmp_path / "config.json").write_text(config.dump())
    join_all(spawn_ranks(_rank_whose_compile_may_fail, str(tmp_path)), timeout=150)
    summary = RunSummary.model_validate_json((tmp_path / "summary.json").read_text())
    assert summary.environment.training_step == "flat"  # the fake capture made no graphs
    assert summary.environment.compiled is False
    reason = summary.environment.training_step_reason or ""
    assert reason.endswith(f"{rank_setup.COMPILE_DROPPED} (on another rank)")
    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    dropped = {e.get("rank"): e["reason"] for e in lines if e.get("event") == "compile_fallback"}
    assert "rank 1: compile refused" in dropped[1]
    assert "on another rank" in dropped[0]
    assert not [e for e in lines if e.get("event") == "fast_path_fallback"]
    assert summary.steps == 3


def _rank_whose_capture_may_fail(rank: int, port: int, out: str, fast_path: str = "auto") -> None:
    """One of two gloo ranks in a spawned process: rank 1's capture raises, rank 0's succeeds."""

    def fake_capture(self: FastStep, x: torch.Tensor, y: torch.Tensor) -> float:
        if rank == 1:
            raise RuntimeError("rank 1: capture refused")
        return 0.25

    rank_setup.choose_path = lambda *a: PathChoice(StepPath.CUDA_GRAPHS, "test: a GPU")
    FastStep.capture = fake_capture  # type: ignore[method-assign]
    FastStep.verify = lambda self, x, y, lr: 0.0  # type: ignore[method-assign]
    config = RunConfig.model_validate_json((Path(out) / "config.json").read_text())
    world = World(rank, 2, rank, 2, "127.0.0.1", port, "env")
    Trainer(config, world, Options(max_steps=3, fast_path=fast_path, compile="0")).run()


def _two_ranks_whose_capture_may_fail(tmp_path: Path, fast_path: str) -> list[Any]:
    """Two gloo ranks started in spawned processes (:func:`_rank_whose_capture_may_fail`): a 2-rank run's
    config in ``tmp_path``; rank 1's capture raises."""
    config = make_config(logreg_task(batch=10, epochs=1, train=100, features=8), tmp_path, 2)
    (tmp_path / "config.json").write_text(config.dump())
    return spawn_ranks(_rank_whose_capture_may_fail, str(tmp_path), fast_path)


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_a_capture_failing_on_one_rank_sends_every_rank_to_eager(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Ranks never run different steps: the fallback is agreed with one all-reduce after capture."""
    join_all(_two_ranks_whose_capture_may_fail(tmp_path, "auto"), timeout=150)
    summary = RunSummary.model_validate_json((tmp_path / "summary.json").read_text())
    assert summary.environment.training_step == "eager"
    assert summary.environment.training_step_reason == rank_setup.OTHER_RANK_CAPTURE_FAILED
    # every rank logs its own cause (rank 0 also into events.jsonl)
    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    fallbacks = {e.get("rank"): e["reason"] for e in lines if e.get("event") == "fast_path_fallback"}
    assert '"fast_path_fallback"' in (tmp_path / "events.jsonl").read_text()
    assert "rank 1: capture refused" in fallbacks[1]
    assert fallbacks[0] == rank_setup.OTHER_RANK_CAPTURE_FAILED
    assert summary.steps == 3


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_with_the_fast_path_required_a_capture_failing_on_one_rank_stops_every_rank(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """MLBENCH_FAST_PATH=on: the rank whose capture failed raises its error and the others raise too, after
    the same vote (it raised before the vote, and its peers waited in it until gloo's timeout)."""
    procs = _two_ranks_whose_capture_may_fail(tmp_path, "on")
    for p in procs:
        p.join(60)
    alive = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        p.kill()
    assert alive == [], f"rank(s) {alive} still waiting for a peer that had stopped"
    assert [p.exitcode for p in procs] == [1, 1]
    assert not (tmp_path / "summary.json").exists()
    said = capfd.readouterr().err
    assert "RuntimeError: rank 1: capture refused" in said  # rank 1: its own cause
    # rank 0: the vote's answer (not gloo's "connection closed" from a peer that had left)
    assert "RuntimeError: MLBENCH_FAST_PATH=on: another rank's CUDA graph capture failed" in said
