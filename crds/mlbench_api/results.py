"""The result contract between runner, launcher and operator.

Rank 0 writes a full :class:`RunSummary` to ``<output>/summary.json``; the launcher
writes :meth:`RunSummary.termination_message` (compact, < 4 KiB, the kubelet's limit)
to ``/dev/termination-log``; the operator parses it back with
:meth:`RunSummary.from_termination_message` into ``status.result``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final, Literal

from pydantic import Field, ValidationError

from mlbench_api.common import ApiModel, Finite, SafeInt
from mlbench_api.errors import InvalidObject, format_errors

TERMINATION_MESSAGE_LIMIT = 4096
SUMMARY_SCHEMA: Final = "mlbench.io/summary/v1"

#: Why a run stopped; ``completed`` is a collectives task's sweep that timed every operation and size.
RunStatus = Literal["success", "goal-not-reached", "aborted"]
StopReason = Literal[
    "goal", "max-epochs", "time-budget", "max-steps", "diverged", "error", "interrupted", "setup-failed", "completed"
]
COLLECTIVES_SCHEMA: Final = "mlbench.io/collectives/v1"


#: The most bytes a free text (a reason, a host name) takes in a termination message that is too long, as JSON.
SHORT_TEXT = 240
#: The environment fields a termination message keeps last (what identifies the run; short by construction).
ENVIRONMENT_IDENTITY = ("worldSize", "backend", "algorithm", "seed", "precision", "trainingStep")


def _shorten(text: str) -> str:
    """``text`` cut (with ``...``) to at most :data:`SHORT_TEXT` bytes as JSON: a non-ASCII character takes 6
    to 12 bytes there, so a cut by characters alone could leave kilobytes."""
    if len(json.dumps(text)) <= SHORT_TEXT:
        return text
    cut = text[:SHORT_TEXT]
    while len(json.dumps(cut + "...")) > SHORT_TEXT:
        cut = cut[:-1]
    return cut + "..."


def _drop_devices(data: dict[str, Any]) -> None:
    data["environment"].pop("devices", None)


def _shorten_texts(data: dict[str, Any]) -> None:
    env = data["environment"]
    for key, value in env.items():
        if isinstance(value, str):
            env[key] = _shorten(value)


def _environment_identity(data: dict[str, Any]) -> None:
    env = data["environment"]
    data["environment"] = {k: env[k] for k in ENVIRONMENT_IDENTITY if k in env}


def _drop_network(data: dict[str, Any]) -> None:
    data.pop("network", None)


def _shorten_the_rest(data: dict[str, Any]) -> None:
    """The last resort: the top level's free texts too. What status.result reads (the figures,
    ``communication``, ``peakBusBandwidth``: bounded) stays."""
    for key in [k for k, v in data.items() if isinstance(v, str) and k not in ("run", "task", "status", "stopReason")]:
        data[key] = _shorten(data[key])


#: How a too long termination message is shrunk, in turn, least needed first.
_SHRINKS = (_drop_devices, _shorten_texts, _environment_identity, _drop_network, _shorten_the_rest)


class PhaseTotals(ApiModel):
    """Seconds per training phase, summed over steps on rank 0 (see the runner docs)."""

    data: Finite = 0.0
    forward: Finite = 0.0
    backward: Finite = 0.0
    compression: Finite = 0.0
    communication: Finite = 0.0
    optimizer: Finite = 0.0
    evaluation: Finite = 0.0


class CommunicationRecord(ApiModel):
    """What the algorithm sends per optimizer step, per rank, so runs compare compression next to time.

    Bytes are the payload a rank hands to the collectives (the tensors' sizes), not bytes on the wire: a ring
    all-reduce moves about 2(k-1)/k of its payload each way, an all-gather receives k-1 payloads.
    """

    collectives: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=8)] = Field(
        default_factory=list
    )
    """The collectives used every step, e.g. all-reduce, all-gather, send-recv (empty for one rank)."""
    bytes_per_step: SafeInt = 0
    """Payload bytes per rank per step that the algorithm declares (a function of the model only)."""
    measured_bytes_per_step: Finite | None = None
    """Payload bytes per rank per step that the communicator counted, averaged over the run's steps."""
    uncompressed_bytes_per_step: SafeInt = 0
    """What allreduce-sgd sends for this model: every parameter once, at its element size."""
    compression_ratio: Finite | None = None
    """uncompressedBytesPerStep / bytesPerStep (1 for the reference; above 1 means less data sent)."""


class CollectiveMeasurement(ApiModel):
    """One collective at one message size, as nccl-tests reports it (see docs/collectives.md).

    ``bytes`` is nccl-tests' S: the buffer of all-reduce and broadcast, the *gathered total* of all-gather
    (each rank contributes bytes / worldSize). ``timeSeconds`` is the mean time per iteration of the
    back-to-back loop, averaged over the ranks (nccl-tests' default ``-a 1``); algbw = bytes / timeSeconds and
    busbw = algbw x the operation's factor (2(n-1)/n, (n-1)/n, 1). The latencies come from a second loop that
    times every iteration alone after a barrier, taking the slowest rank's time of each iteration.
    """

    op: Annotated[str, Field(max_length=32)]
    """all-reduce, all-gather or broadcast."""
    bytes: SafeInt
    """S in bytes: the message (all-reduce, broadcast) or the gathered total (all-gather)."""
    elements: SafeInt
    """float32 elements of each rank's input buffer (bytes / 4, divided by worldSize for all-gather)."""
    iterations: SafeInt
    """Timed iterations of each of the two loops (fewer than the task's where maxSecondsPerSize capped them)."""
    time_seconds: Finite
    """Mean seconds per iteration of the back-to-back loop, averaged over the ranks."""
    algorithm_bandwidth: Finite
    """algbw in bytes per second: bytes / timeSeconds."""
    bus_bandwidth: Finite
    """busbw in bytes per second: algorithmBandwidth x busFactor."""
    bus_factor: Finite
    """The operation's correction factor at this world size: 2(n-1)/n, (n-1)/n or 1."""
    latency_mean_seconds: Finite
    latency_min_seconds: Finite
    latency_p50_seconds: Finite
    latency_p90_seconds: Finite
    latency_p99_seconds: Finite
    latency_max_seconds: Finite


class CollectiveResult(ApiModel):
    """A collectives task's sweep: one row per (operation, size), written by rank 0 to collectives.json and
    carried in summary.json (``collectives``)."""

    schema_: Literal["mlbench.io/collectives/v1"] = Field(default=COLLECTIVES_SCHEMA, alias="schema")
    backend: str
    world_size: SafeInt
    device: str
    dtype: str = "float32"
    warmup_iterations: SafeInt
    rows: list[CollectiveMeasurement] = Field(default_factory=list)

    def peak_bus_bandwidth(self) -> dict[str, float]:
        """The highest bus bandwidth (bytes/s) of each operation over its sizes."""
        peaks: dict[str, float] = {}
        for row in self.rows:
            peaks[row.op] = max(peaks.get(row.op, 0.0), row.bus_bandwidth)
        return peaks


class RankHardware(ApiModel):
    """The machine one rank ran on: what the runner sees (node, driver, CUDA) and, in a cluster, what the
    operator read from its node's labels when it kept the results (null where unknown)."""

    node: Annotated[str, Field(max_length=253)] | None = None
    instance_type: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="The node's node.kubernetes.io/instance-type label."
    )
    zone: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="The node's topology.kubernetes.io/zone label."
    )
    gpu_product: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="The node's nvidia.com/gpu.product label (GPU feature discovery)."
    )
    gpu_count: Annotated[str, Field(max_length=63)] | None = Field(
        default=None, description="The node's nvidia.com/gpu.count label."
    )
    driver: Annotated[str, Field(max_length=63)] | None = Field(
        default=None, description="The NVIDIA driver the rank saw (/proc/driver/nvidia/version); null without one."
    )
    cuda: Annotated[str, Field(max_length=63)] | None = Field(
        default=None, description="The CUDA version PyTorch was built with (torch.version.cuda); null for a CPU build."
    )


class Environment(ApiModel):
    torch: str | None = None
    cuda: str | None = None
    devices: Annotated[list[str], Field(max_length=64)] = Field(default_factory=list)
    world_size: SafeInt
    backend: str
    algorithm: str | None = None
    seed: SafeInt | None = None
    hostname: str | None = None
    nodes: Annotated[list[str], Field(max_length=4096)] | None = Field(
        default=None,
        description="The machine of each rank, in rank order: its pod's Kubernetes node, or the host's name outside "
        "a cluster.",
    )
    hardware: Annotated[list[RankHardware], Field(max_length=4096)] | None = Field(
        default=None, description="Each rank's machine, in rank order: node, instance type, zone, GPU, driver, CUDA."
    )
    precision: str | None = Field(default=None, description="fp32, fp64 or bf16-autocast.")
    channels_last: bool | None = None
    training_step: Literal["eager", "flat", "cuda-graphs"] | None = Field(
        default=None,
        description="Which training step ran: eager (torch.optim over the model), flat (the same update over one "
        "flat buffer) or cuda-graphs (flat, with forward, backward and optimizer replayed as CUDA graphs).",
    )
    training_step_reason: str | None = Field(default=None, description="Why that step ran (or why not the fast one).")
    capture_seconds: Finite | None = Field(
        default=None,
        description="The fast step's set-up on synthetic batches, left out of the wall clock: torch.compile's wrapper, "
        "the warm-up (compiling, cuDNN autotuning), CUDA graph capture, the capture's check against the eager step "
        "and the ranks' vote on it.",
    )
    compiled: bool | None = Field(
        default=None, description="The fast step's model ran through torch.compile (MLBENCH_COMPILE)."
    )
    tf32: str | None = Field(
        default=None,
        description="GPU only: where TensorFloat-32 was allowed (cudnn: inside convolutions, PyTorch's default).",
    )
    cudnn_benchmark: bool | None = Field(
        default=None,
        description="GPU only: cuDNN timed its convolution algorithms per shape and kept the fastest "
        "(MLBENCH_CUDNN_BENCHMARK); false: its heuristic choice.",
    )


class EpochRecord(ApiModel):
    epoch: SafeInt
    accuracy: Finite | None = None
    loss: Finite | None = None
    score: Finite | None = Field(default=None, description="The goal metric's value after this epoch.")
    wall_seconds: Finite
    lr: Finite | None = None


class RunSummary(ApiModel):
    """The outcome of one run, as rank 0 saw it."""

    schema_: Literal["mlbench.io/summary/v1"] = Field(default=SUMMARY_SCHEMA, alias="schema")
    run: str
    task: str
    status: RunStatus
    stop_reason: StopReason | None = Field(default=None, description="Why training stopped.")
    goal_reached: bool
    goal_target: Finite | None = None
    time_to_goal_seconds: Finite | None = Field(default=None, description="Wall clock from run start to the goal.")
    best_accuracy: Finite | None = None
    final_accuracy: Finite | None = None
    goal_metric: str | None = Field(default=None, description="The metric the goal compares (task goal.metric).")
    best_score: Finite | None = Field(
        default=None, description="The goal metric's best value (lowest for perplexity, loss)."
    )
    final_score: Finite | None = Field(default=None, description="The goal metric's value at the last evaluation.")
    bleu_signature: str | None = Field(
        default=None, description="Translation tasks with a bleu goal: sacrebleu's signature (how BLEU was computed)."
    )
    skipped_steps: SafeInt | None = Field(
        default=None, description="Translation tasks: optimizer steps the loss scaler skipped (non-finite gradient)."
    )
    update_freq: SafeInt | None = Field(
        default=None, description="Translation tasks: micro-batches accumulated per optimizer step on each rank."
    )
    epochs: Finite
    steps: SafeInt
    samples: SafeInt
    wall_clock_seconds: Finite = Field(description="Run start (before data is touched) to run stop.")
    train_seconds: Finite = Field(description="Sum of per-step times (data+forward+backward+comm+optimizer).")
    compute_seconds: Finite
    communication_seconds: Finite
    comm_compute_ratio: Finite | None = None
    samples_per_second: Finite
    phases: PhaseTotals
    environment: Environment
    communication: CommunicationRecord | None = None
    network: dict[str, Finite] | None = Field(
        default=None, description="The emulated network conditions the run declared (spec.network), as applied."
    )
    history: list[EpochRecord] = Field(default_factory=list)
    parameter_digests: Annotated[list[str], Field(max_length=4096)] | None = Field(
        default=None,
        description="A run that ended with every rank in step: each rank's SHA-1 of its model parameters, in rank "
        "order (one value under a synchronous algorithm; decentralized ones differ by design).",
    )
    resumes: SafeInt | None = Field(
        default=None,
        description="Times the run continued from an epoch-end checkpoint after a restart (0: never); unset: no "
        "checkpoints. Its wall clock and time to goal count the lost time and the restarts.",
    )
    peak_bus_bandwidth: dict[str, Finite] | None = Field(
        default=None,
        description="Collectives tasks: the highest bus bandwidth (bytes/s) of each operation over the sizes swept.",
    )
    collectives: CollectiveResult | None = Field(
        default=None, description="Collectives tasks: every (operation, size) row; not in the termination message."
    )

    def termination_message(self) -> str:
        """Compact JSON that fits the kubelet's 4 KiB termination-message limit.

        The kubelet keeps a longer message's *last* 4096 bytes: JSON without its start, which fails the run as
        InvalidResult. So it is shrunk, least needed first (:data:`_SHRINKS`), until it fits: a fallback reason
        holding a long CUDA error made a successful run's message 6 KB."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        data.pop("history", None)
        data.pop("collectives", None)  # the full table stays in summary.json; peakBusBandwidth sums it up
        data["environment"].pop("hardware", None)  # per rank: summary.json keeps it (status.result has no room)
        data.pop("parameterDigests", None)  # per rank, as hardware
        text = json.dumps(data, separators=(",", ":"))
        for shrink in _SHRINKS:
            if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT:
                break
            shrink(data)
            text = json.dumps(data, separators=(",", ":"))
        return text

    @classmethod
    def from_termination_message(cls, text: str) -> RunSummary:
        """Parse a launcher's termination message; raises ValueError when malformed.

        A value the API server could not store in ``status.result`` (NaN, Infinity or an overflow
        to it such as ``1e400``, an integer beyond 2^53) is malformed too: the error names the field.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:  # JSONDecodeError, or an integer with more digits than Python converts
            raise ValueError(f"termination message is not JSON: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InvalidObject("termination message", format_errors(exc)) from exc
