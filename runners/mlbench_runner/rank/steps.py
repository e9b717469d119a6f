"""One optimizer step, two ways: the eager reference and the fast path.

Both run the same phases on one :class:`~mlbench_runner.timing.PhaseTimer` (data, forward,
backward, the algorithm's compression and communication, optimizer), so their figures
compare. The eager step is the readable reference: ``torch.optim.SGD`` over the model's
parameters. The fast step computes exactly the same update over flat buffers
(:mod:`mlbench_runner.flat`) and, on a GPU, replays three CUDA graphs, one per phase:

* ``forward``: the model and the loss on static input buffers;
* ``backward``: ``loss.backward()``, accumulating into the flat gradient buffer;
* ``optimizer``: :meth:`FlatSGD.step` with the rate read from a device tensor.

The data phase (index gather, augmentation, copy into the static inputs) and the
algorithm's collectives stay eager, between the graphs, so communication is still timed
as communication and no collective is ever captured (a rank that stops early cannot leave
a graph waiting on a peer). Each phase's CUDA events are recorded outside the capture,
around the replay. What each figure covers is in docs/runner.md.

A capture is checked before it is used: from one saved state the graphs and the same
code run eagerly take one step on a synthetic batch, and the parameters must agree to
round-off, else the run falls back to the eager step and says why (``auto``) or stops
(``MLBENCH_FAST_PATH=on``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Protocol

import torch
from torch import nn

from mlbench_runner.algorithms import DistributedAlgorithm
from mlbench_runner.algorithms.base import FlatGradients
from mlbench_runner.flat import FlatParameters, FlatSGD
from mlbench_runner.rank.tasks import TaskKernel
from mlbench_runner.timing import PhaseTimer

#: Warm-up iterations on a side stream before capture (cuDNN and allocator initialisation, as torch's docs ask).
WARMUP_ITERATIONS = 3
#: Largest relative parameter difference between one replayed and one eager step that still counts as round-off.
VERIFY_TOLERANCE = 1e-4


class StepPath(StrEnum):
    """Which training step ran (recorded in the result's environment)."""

    EAGER = "eager"
    FLAT = "flat"
    CUDA_GRAPHS = "cuda-graphs"


@dataclass(frozen=True)
class PathChoice:
    path: StepPath
    reason: str


def choose_path(requested: str, algorithm: str, optimizer: str, device_type: str) -> PathChoice:
    """The step to build for ``MLBENCH_FAST_PATH`` = ``requested`` (auto, on, off).

    The fast path covers the reference algorithm with SGD, the closed division's optimizer;
    every other algorithm keeps its own eager hooks. ``on`` where it cannot apply is an input error.
    """
    if requested == "off":
        return PathChoice(StepPath.EAGER, "MLBENCH_FAST_PATH=off")
    if algorithm != "allreduce-sgd" or optimizer != "sgd":
        reason = f"the fast path covers allreduce-sgd with sgd, not {algorithm} with {optimizer}"
        if requested == "on":
            raise ValueError(f"MLBENCH_FAST_PATH: on, but {reason}")
        return PathChoice(StepPath.EAGER, reason)
    if device_type == "cuda":
        return PathChoice(StepPath.CUDA_GRAPHS, "forward, backward and optimizer captured as CUDA graphs")
    return PathChoice(StepPath.FLAT, "flat parameter and gradient buffers (CUDA graphs need a GPU)")


def compile_wanted(setting: str, path: StepPath) -> bool:
    """Whether the fast step's model goes through torch.compile, for ``MLBENCH_COMPILE`` = ``setting``.

    ``auto`` compiles the captured GPU step only: on an H100 the compiled graphs took 2.78 s per epoch against
    3.10 (means over three seeds) and reached 80 % in 37.4 s against 41.1, for 14-30 s of set-up left out of the
    clock. Nothing measured the CPU's flat step faster compiled, so ``auto`` leaves it as it is; ``1`` compiles
    it too. The eager reference step is never compiled.
    """
    if path is StepPath.EAGER:
        return False
    if setting == "auto":
        return path is StepPath.CUDA_GRAPHS
    return setting == "1"


class Step(Protocol):
    """One optimizer step on the batch ``idx``; returns the loss (a device tensor, read it before the next step)."""

    @property
    def path(self) -> StepPath: ...

    def __call__(self, step: int, idx: torch.Tensor, lr: float) -> torch.Tensor: ...


def precision_context(autocast: bool) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on CUDA (open division), without the weight-cast cache a graph replay would not refresh."""
    if autocast:
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


class EagerStep:
    """The reference step: ``torch.optim.SGD`` (or the algorithm's optimizer) around the algorithm's hooks."""

    path = StepPath.EAGER

    def __init__(
        self,
        kernel: TaskKernel,
        model: nn.Module,
        algorithm: DistributedAlgorithm,
        *,
        optimizer: torch.optim.Optimizer,
        timer: PhaseTimer,
        autocast: bool,
    ) -> None:
        self.kernel, self.model, self.algorithm = kernel, model, algorithm
        self.optimizer, self.timer, self.autocast = optimizer, timer, autocast

    def __call__(self, step: int, idx: torch.Tensor, lr: float) -> torch.Tensor:
        timer = self.timer
        timer.start_step(step)
        with timer.phase("data"):
            x, y = self.kernel.train_batch(idx)
        with timer.phase("forward"), precision_context(self.autocast):
            loss = self.kernel.loss(self.model(x), y, self.model)
        with timer.phase("backward"):
            loss.backward()
        self.algorithm.synchronize(self.model, timer)  # opens its compression and communication phases
        with timer.phase("optimizer"):
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.algorithm.zero_grad(self.model)
        self.algorithm.after_step(self.model, timer)
        timer.end_step()
        return loss.detach()


@dataclass
class Graphs:
    """The captured segments and the static tensors they read and write."""

    x: torch.Tensor
    y: torch.Tensor
    loss: torch.Tensor
    forward: torch.cuda.CUDAGraph
    backward: torch.cuda.CUDAGraph
    optimizer: torch.cuda.CUDAGraph


class FastStep:
    """allreduce-sgd's step over flat buffers; on CUDA, after :meth:`capture`, three graph replays."""

    def __init__(
        self,
        kernel: TaskKernel,
        model: nn.Module,
        algorithm: DistributedAlgorithm,
        *,
        grads: FlatGradients,
        sgd_options: tuple[float, float, bool, float],
        timer: PhaseTimer,
        autocast: bool,
        compile: bool = False,
    ) -> None:
        lr, momentum, nesterov, weight_decay = sgd_options
        self.kernel, self.model, self.algorithm, self.timer, self.autocast = kernel, model, algorithm, timer, autocast
        self.params = FlatParameters(model)  # before compiling: the compiled code reads the flat views
        #: What the step runs forward through: the model, or (``compile``) torch.compile's wrapper of it,
        #: which shares its parameters and buffers. Compiling happens at the first call, in :meth:`warm_up`.
        self.net: nn.Module = model
        self.compiled = compile
        #: Seconds spent wrapping the model: torch.compile imports its compiler stack here (about 2 s on CPU),
        #: initialisation that the run's clock leaves out with the warm-up (the compiling itself happens there).
        self.compile_seconds = 0.0
        #: Why torch.compile could not even wrap the model (an unsupported platform): raised where the compiled
        #: model is first used (:meth:`warm_up`, :meth:`capture`), so that the caller's fallback and the ranks'
        #: vote on the capture cover it as they cover a failed compile.
        self.compile_error: Exception | None = None
        if compile:
            start = time.perf_counter()
            try:
                self.net = torch.compile(model, dynamic=False)  # type: ignore[assignment]
            except Exception as exc:
                self.compile_error = exc
            self.compile_seconds = time.perf_counter() - start
        self.sgd = FlatSGD(
            self.params.flat, grads.flat, lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay
        )
        self.graphs: Graphs | None = None

    @property
    def path(self) -> StepPath:
        return StepPath.CUDA_GRAPHS if self.graphs is not None else StepPath.FLAT

    def drop_compile(self) -> None:
        """Run the model itself from now on: torch.compile's attempt failed, and the next capture goes without it.

        The failed attempt left the state as it was (:meth:`capture` restores it whatever happens).
        """
        self.net = self.model
        self.compiled = False
        self.compile_error = None
        self.graphs = None

    def _check_compiled(self) -> None:
        """Raise :attr:`compile_error` where the compiled model would first run."""
        if self.compile_error is not None:
            raise RuntimeError(f"torch.compile failed: {self.compile_error}") from self.compile_error

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with precision_context(self.autocast):
            return self.kernel.loss(self.net(x), y, self.model)

    def __call__(self, step: int, idx: torch.Tensor, lr: float) -> torch.Tensor:
        timer, graphs = self.timer, self.graphs
        timer.start_step(step)
        with timer.phase("data"):
            x, y = self.kernel.train_batch(idx)
            if graphs is not None:
                graphs.x.copy_(x)
                graphs.y.copy_(y)
        with timer.phase("forward"):
            if graphs is not None:
                graphs.forward.replay()
                loss = graphs.loss
            else:
                loss = self._loss(x, y)
        with timer.phase("backward"):
            if graphs is not None:
                graphs.backward.replay()
            else:
                loss.backward()
        self.algorithm.synchronize(self.model, timer)
        with timer.phase("optimizer"):
            self.sgd.set_lr(lr)
            if graphs is not None:
                graphs.optimizer.replay()
            else:
                self.sgd.step()
        timer.end_step()
        return loss.detach()

    # -- capture ------------------------------------------------------------------------
    def _state(self) -> list[torch.Tensor]:
        """Everything a step changes: parameters, gradients, buffers (BatchNorm), optimizer state."""
        return [self.params.flat, self.sgd.grads, *self.sgd.state(), *self.model.buffers()]

    @contextlib.contextmanager
    def _restored(self) -> Iterator[None]:
        """Run the block, then put back the state it changed (same storage, so graphs stay valid)."""
        saved = [t.detach().clone() for t in self._state()]
        try:
            yield
        finally:
            with torch.no_grad():
                for t, s in zip(self._state(), saved, strict=True):
                    t.copy_(s)

    def _eager_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self._loss(x, y)
        loss.backward()
        self.sgd.step()
        return loss

    def _warm(self, x: torch.Tensor, y: torch.Tensor) -> None:
        for _ in range(WARMUP_ITERATIONS):
            self._eager_step(x, y)

    def warm_up(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """A few steps on the synthetic batch ``x, y``, state restored; returns the seconds it took.

        What a first step pays once (torch.compile, cuDNN's autotuning) is paid here, as initialisation,
        rather than inside the run's clock. :meth:`capture` does the same before capturing.
        """
        self._check_compiled()
        start = time.perf_counter()
        with self._restored():
            self._warm(x, y)
        return time.perf_counter() - start

    def capture(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Capture the three segments on the synthetic batch ``x, y``; returns the seconds it took.

        The warm-up steps and the capture leave the model, gradients and optimizer state as they were.
        """
        self._check_compiled()
        start = time.perf_counter()
        with self._restored():
            static_x, static_y = x.clone(), y.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._warm(static_x, static_y)
            torch.cuda.current_stream().wait_stream(side)
            forward, backward, optimizer = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(forward):
                loss = self._loss(static_x, static_y)
            with torch.cuda.graph(backward, pool=forward.pool()):
                loss.backward()
            with torch.cuda.graph(optimizer):
                self.sgd.step()
            torch.cuda.synchronize()
        self.graphs = Graphs(static_x, static_y, loss, forward, backward, optimizer)
        return time.perf_counter() - start

    def verify(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
        """Largest parameter difference (relative to the largest parameter) between one replayed and one eager step.

        Both start from the current state, which is restored afterwards.
        """
        graphs = self.graphs
        if graphs is None:
            raise RuntimeError("verify() needs capture() first")
        self.sgd.set_lr(lr)
        with self._restored():
            graphs.x.copy_(x)
            graphs.y.copy_(y)
            graphs.forward.replay()
            graphs.backward.replay()
            graphs.optimizer.replay()
            replayed = self.params.flat.detach().clone()
        with self._restored():
            self._eager_step(x, y)
            eager = self.params.flat.detach().clone()
        scale = max(1.0, float(eager.abs().max()))
        return float((replayed - eager).abs().max()) / scale


class CaptureCheck(NamedTuple):
    """What capturing the fast step took, each part in seconds, and how far its replay was from eager."""

    capture_seconds: float  #: warm-up (the compiling, with torch.compile) and capture
    verify_seconds: float  #: the check: one replayed and one eager step
    difference: float  #: relative, largest parameter


def capture_checked(fast: FastStep, kernel: TaskKernel, batch: int, seed: int, lr: float) -> CaptureCheck:
    """Capture on one synthetic batch and check the graphs on another.

    Each part is timed on its own, for the ``fast_path`` event: the caller leaves the whole attempt out of
    the clock (initialisation on synthetic batches), whose parts, with torch.compile, were once partly left in
    (about 8 s of a 41 s H100 run's clock fell outside its epochs).

    Raises when the capture fails or the replayed step is not the eager one to round-off.
    """
    capture_seconds = fast.capture(*kernel.synthetic_batch(batch, seed=seed))
    start = time.perf_counter()
    difference = fast.verify(*kernel.synthetic_batch(batch, seed=seed + 1), lr=lr)
    verify_seconds = time.perf_counter() - start
    if not difference <= VERIFY_TOLERANCE:  # NaN fails too
        fast.graphs = None
        raise RuntimeError(
            f"a replayed step differs from the eager one by {difference:.3g} (relative; at most "
            f"{VERIFY_TOLERANCE:g} is round-off)"
        )
    return CaptureCheck(capture_seconds, verify_seconds, difference)
