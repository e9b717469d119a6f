"""The runner's ``MLBENCH_*`` execution knobs, declared once.

They are for debugging and benchmarks, outside the run configuration (which is what a result is
judged by). :data:`KNOBS` is the single declaration: :meth:`Options.from_env` parses it, the
launcher forwards every knob to the ranks (``launch.FORWARD_ENV``), and docs/runner.md's table is
:func:`knob_table` (tests/runner/test_options.py compares them; ``python -m mlbench_runner.options``
prints the table).

Importing this module does not import torch (the launcher imports it): the ``MLBENCH_DTYPE``
value becomes a ``torch.dtype`` only when parsed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlbench_api.contract import ENV_METRICS_LINGER_SECONDS
from mlbench_runner import manifest

if TYPE_CHECKING:
    import torch


def _dtype(name: str) -> torch.dtype:
    # Lazy: the launcher parses the knobs without torch (tests/runner/test_options.py).
    import torch  # noqa: PLC0415

    return {"float32": torch.float32, "float64": torch.float64}[name]


def _flag(value: str) -> bool:
    return value == "1"


@dataclass(frozen=True)
class Knob:
    """One ``MLBENCH_*`` variable: what it parses to, its default, its allowed values and what it is for."""

    env: str
    #: The :class:`Options` field it sets; None for a knob read where it is used (``TRACE_GOSSIP``).
    field: str | None
    doc: str
    #: The value when unset or empty, as it would be written; None: unset means no value (the field's None).
    default: str | None = None
    #: The allowed values, when they are a closed set.
    choices: tuple[str, ...] = ()
    #: Numeric knobs: int or float, with a lower bound.
    number: type[int] | type[float] | None = None
    minimum: float = 0
    #: A valid value (a choice, or any string for a free-form knob) to the field's value.
    convert: Callable[[str], Any] = str
    #: What the table lists for a knob without choices (the allowed values in words).
    values: str = ""

    def parse(self, raw: str) -> Any:
        """The field value of ``raw``; a bad value raises :class:`ValueError` naming the variable."""
        if self.choices and raw not in self.choices:
            raise ValueError(f"{self.env}: {raw!r} is not {' or '.join(self.choices)}")
        if self.number is not None:
            try:
                number = self.number(raw)
            except ValueError:
                kind = "an integer" if self.number is int else "a number"
                raise ValueError(f"{self.env}: {raw!r} is not {kind}") from None
            if not math.isfinite(number):
                raise ValueError(f"{self.env}: {raw!r} is not a finite number")
            if number < self.minimum:
                raise ValueError(f"{self.env}: {raw!r} is below {self.minimum:g}")
            return number
        return self.convert(raw)

    def read(self, env: Mapping[str, str] | None = None) -> Any:
        """This knob's value in ``env`` (default: the process environment); unset or empty: the default."""
        raw = (os.environ if env is None else env).get(self.env, "")
        if raw:
            return self.parse(raw)
        return None if self.default is None else self.parse(self.default)

    def allowed(self) -> str:
        return "`" + "`, `".join(self.choices) + "`" if self.choices else self.values


TRACE_GOSSIP = Knob(
    "MLBENCH_TRACE_GOSSIP",
    None,
    "decentralized-sgd writes every rank's parameters at each step's start, after its local step and "
    "after the gossip to `<dir>/gossip-rank-<r>.jsonl` (small models only)",
    values="a directory",
)

DATASET_VERIFY = Knob(
    "MLBENCH_DATASET_VERIFY",
    None,
    "what each rank checks of a fetched dataset against its manifest before loading: every file's size, or "
    "also its sha256 (rereads the whole dataset from the volume on every rank)",
    default="sizes",
    choices=(manifest.SIZES, manifest.SHA256),
)

KNOBS: tuple[Knob, ...] = (
    Knob(
        "MLBENCH_DTYPE",
        "dtype",
        "parameter and input dtype (float64: the equivalence tests)",
        default="float32",
        choices=("float32", "float64"),
        convert=_dtype,
    ),
    Knob(
        "MLBENCH_PRECISION",
        "precision",
        "bf16: bf16 autocast, GPU only (open division)",
        default="fp32",
        choices=("fp32", "bf16"),
    ),
    Knob(
        "MLBENCH_CHANNELS_LAST",
        "channels_last",
        "1: channels_last memory format, GPU only (open division)",
        default="0",
        choices=("0", "1"),
        convert=_flag,
    ),
    Knob(
        "MLBENCH_FAST_PATH",
        "fast_path",
        "the captured/flat fast training step: auto uses it where it verifies, on insists (a failed "
        "capture is an error), off is the eager reference step",
        default="auto",
        choices=("auto", "on", "off"),
    ),
    Knob(
        "MLBENCH_COMPILE",
        "compile",
        "torch.compile (fixed shapes) for the fast step's model before it is warmed up and captured, as "
        "initialisation outside the clock: auto on a GPU's captured step only, and without it if compiling or "
        "its capture fails; 1 wherever the fast step runs (a failure is the capture's); 0 never (the eager "
        "reference step is never compiled)",
        default="auto",
        choices=("auto", "0", "1"),
    ),
    Knob(
        "MLBENCH_CUDNN_BENCHMARK",
        "cudnn_benchmark",
        "GPU: 1 lets cuDNN time its convolution algorithms at each shape's first use and keep the fastest "
        "(the shapes are fixed; that first use is in the capture's warm-up or the first steps); 0 keeps its "
        "heuristic choice",
        default="1",
        choices=("0", "1"),
        convert=_flag,
    ),
    Knob(
        "MLBENCH_PROCESS_GROUP",
        "process_group",
        "1: a torch.distributed process group even for one rank, so a world-size-1 run of the all-reduce "
        "family (allreduce-sgd, centralized-adam, ddp) all-reduces through its backend (gloo, nccl) instead of "
        "skipping it (benchmarks: the nccl path on one GPU); the compressing and decentralized algorithms keep "
        "their one-rank shortcut (the exact gradient)",
        default="0",
        choices=("0", "1"),
        convert=_flag,
    ),
    Knob(
        "MLBENCH_PHASE_TIMING",
        "phase_timing",
        "0: no per-phase timing (only to measure the timer's own cost); steps are still counted",
        default="1",
        choices=("0", "1"),
        convert=_flag,
    ),
    Knob(
        "MLBENCH_MAX_STEPS",
        "max_steps",
        "stop after this many steps (benchmarks, smoke runs; the run ends goal-not-reached; unset: no limit)",
        number=int,
        minimum=1,
        values="integer ≥ 1",
    ),
    Knob(
        "MLBENCH_TRACE_PARAMS",
        "trace_params",
        "1: record parameter hashes, norms (and values of small models) after every step in `ranks/rank-<r>.json`",
        default="0",
        choices=("0", "1"),
        convert=_flag,
    ),
    Knob(
        "MLBENCH_THREADS",
        "threads",
        "torch threads per rank (unset: the CPUs this process may use ÷ local ranks; a fractional CPU limit "
        "rounds down, at least 1)",
        number=int,
        minimum=1,
        values="integer ≥ 1",
    ),
    Knob(
        ENV_METRICS_LINGER_SECONDS,
        "linger_seconds",
        "keep serving metrics this long after the run, for a last scrape (the operator sets it, default 45)",
        default="0",
        number=float,
        minimum=0,
        values="seconds ≥ 0",
    ),
    TRACE_GOSSIP,
    DATASET_VERIFY,
)


@dataclass
class Options:
    """Execution choices outside the RunConfig: the :data:`KNOBS` that have a field."""

    dtype: torch.dtype = dataclasses.field(default_factory=lambda: _dtype("float32"))
    precision: str = "fp32"
    channels_last: bool = False
    fast_path: str = "auto"
    compile: str = "auto"
    cudnn_benchmark: bool = True
    process_group: bool = False
    phase_timing: bool = True
    max_steps: int | None = None
    trace_params: bool = False
    threads: int | None = None
    linger_seconds: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Options:
        """The knobs set in ``env`` (default: the process environment); a bad value raises
        :class:`ValueError` naming its variable."""
        source = os.environ if env is None else env
        return cls(**{knob.field: knob.read(source) for knob in KNOBS if knob.field is not None})


def knob_names() -> tuple[str, ...]:
    """Every knob's variable, in declaration order (the launcher forwards them all)."""
    return tuple(knob.env for knob in KNOBS)


def knob_table() -> str:
    """docs/runner.md's table of the knobs (Markdown)."""
    rows = ["| variable | values | default | what it does |", "|---|---|---|---|"]
    for knob in KNOBS:
        default = f"`{knob.default}`" if knob.default is not None else "unset"
        rows.append(f"| `{knob.env}` | {knob.allowed()} | {default} | {knob.doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(knob_table(), end="")
