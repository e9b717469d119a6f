"""Prometheus metrics of one rank, served on ``metrics_port + local_rank`` (0 disables).

Names carry their unit (Prometheus conventions); see docs/runner.md for the list. Each
rank has its own registry so an in-process test can build several.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from mlbench_runner.timing import PHASES, StepTiming

METRIC_NAMES = (
    "mlbench_run_info",
    "mlbench_phase_seconds_total",
    "mlbench_step_duration_seconds",
    "mlbench_steps_total",
    "mlbench_samples_total",
    "mlbench_epoch",
    "mlbench_loss",
    "mlbench_accuracy",
    "mlbench_score",
    "mlbench_learning_rate",
    "mlbench_samples_per_second",
    "mlbench_goal_reached",
    "mlbench_communication_bytes_per_step",
    "mlbench_communication_uncompressed_bytes_per_step",
    "mlbench_communication_bytes_total",
)


#: Step-duration buckets: 50 µs to 14 s, each 1.5x the last. A step is 0.4 ms (logistic regression) to
#: seconds (ResNet-20 on CPU), and 1.7 against 2.0 ms (the GPU paths) must fall in different buckets, or
#: histogram_quantile interpolates the same curve for both (as the coarser 1-2.5-5 ladder did).
STEP_BUCKETS = tuple(round(5e-5 * 1.5**i, 9) for i in range(32))


class LateGauge:
    """A gauge that is absent from the page until it is first set. A label-less prometheus_client gauge
    reads 0 from the start, and "no evaluation yet" would then read as an accuracy of 0 (the operator
    copies it into ``status.progress``, which ``kubectl get`` shows) and a loss of 0; absent is "no data"."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self._name, self._documentation, self._registry = name, documentation, registry
        self._gauge: Gauge | None = None

    def set(self, value: float) -> None:
        if self._gauge is None:
            self._gauge = Gauge(self._name, self._documentation, registry=self._registry)
        self._gauge.set(value)


class RunnerMetrics:
    """The runner's gauges and counters; ``serve`` starts the HTTP endpoint."""

    def __init__(self, run: str, task: str, backend: str, *, world_size: int, algorithm: str, rank: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.info = Gauge(
            "mlbench_run_info",
            "Constant 1, labelled with the run's identity.",
            ["run", "task", "backend", "world_size", "algorithm", "rank"],
            registry=r,
        )
        self.info.labels(run, task, backend, str(world_size), algorithm, str(rank)).set(1)
        self.phase_seconds = Counter(
            "mlbench_phase_seconds",
            "Seconds spent per phase (data, forward, backward, compression, communication, optimizer, evaluation).",
            ["phase"],
            registry=r,
        )
        for phase in (*PHASES, "evaluation"):
            self.phase_seconds.labels(phase)
        self.step_duration = Histogram(
            "mlbench_step_duration_seconds",
            "Duration of one optimizer step (sum of its phases).",
            registry=r,
            buckets=STEP_BUCKETS,
        )
        self.steps = Counter("mlbench_steps", "Optimizer steps taken by this rank.", registry=r)
        self.samples = Counter("mlbench_samples", "Training samples processed by this rank.", registry=r)
        self.epoch = Gauge("mlbench_epoch", "Epochs completed (fractional during an epoch).", registry=r)
        self.loss = LateGauge("mlbench_loss", "Mean training loss of the last epoch on this rank.", r)
        self.accuracy = LateGauge("mlbench_accuracy", "Last test accuracy (fraction, all ranks).", r)
        self.score = LateGauge(
            "mlbench_score",
            "The task's goal metric at the last evaluation (goal.metric: an accuracy as a fraction, BLEU 0-100, "
            "a perplexity or a loss).",
            r,
        )
        self.lr = Gauge("mlbench_learning_rate", "Current learning rate.", registry=r)
        self.throughput = LateGauge(
            "mlbench_samples_per_second", "Global training samples per second of step time, so far.", r
        )
        self.goal = Gauge(
            "mlbench_goal_reached",
            "1 while the last evaluation meets the accuracy goal (a time-to-accuracy run stops there; an "
            "accuracy-after-time run is judged by its final one), else 0.",
            registry=r,
        )
        self.bytes_per_step = Gauge(
            "mlbench_communication_bytes_per_step",
            "Payload bytes this rank hands to collectives per step, as the algorithm declares them.",
            registry=r,
        )
        self.uncompressed_bytes_per_step = Gauge(
            "mlbench_communication_uncompressed_bytes_per_step",
            "Bytes of this rank's gradient per step before compression (over bytes_per_step: the compression ratio).",
            registry=r,
        )
        self.bytes_sent = Counter(
            "mlbench_communication_bytes",
            "Payload bytes this rank handed to the algorithm's collectives, as counted (0 for ddp: not counted).",
            registry=r,
        )

    def serve(self, port: int) -> None:
        """Start the endpoint on ``port`` (all interfaces); ``0`` means metrics are off."""
        if port:
            start_http_server(port, registry=self.registry)

    def observe_steps(self, steps: list[StepTiming], samples_per_step: int) -> None:
        """Count every step done; time only the timed ones (an untimed step is not a zero-second one)."""
        for step in steps:
            if not step.timed:
                continue
            for phase, seconds in step.phases.items():
                self.phase_seconds.labels(phase).inc(seconds)
            self.step_duration.observe(step.total)
        self.steps.inc(len(steps))
        self.samples.inc(len(steps) * samples_per_step)


#: The series of a collectives task (task 0a; docs/collectives.md), served instead of the training ones.
COLLECTIVE_METRIC_NAMES = (
    "mlbench_run_info",
    "mlbench_steps_total",
    "mlbench_collective_algorithm_bandwidth_bytes_per_second",
    "mlbench_collective_bus_bandwidth_bytes_per_second",
    "mlbench_collective_latency_seconds",
)


class CollectiveMetrics:
    """A collectives task's series: one gauge per (op, bytes) once that size is timed (rank 0 only), and
    ``mlbench_steps_total`` counting timed iterations, which the operator's progress (and its stall
    detection) reads as it reads a training run's steps."""

    def __init__(self, run: str, task: str, backend: str, *, world_size: int, rank: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.info = Gauge(
            "mlbench_run_info",
            "Constant 1, labelled with the run's identity.",
            ["run", "task", "backend", "world_size", "algorithm", "rank"],
            registry=r,
        )
        self.info.labels(run, task, backend, str(world_size), "collectives", str(rank)).set(1)
        self.steps = Counter("mlbench_steps", "Timed collective iterations done by this rank.", registry=r)
        self.algorithm_bandwidth = Gauge(
            "mlbench_collective_algorithm_bandwidth_bytes_per_second",
            "nccl-tests' algbw: message bytes / mean seconds per iteration.",
            ["op", "bytes"],
            registry=r,
        )
        self.bus_bandwidth = Gauge(
            "mlbench_collective_bus_bandwidth_bytes_per_second",
            "nccl-tests' busbw: algbw x 2(n-1)/n (all-reduce), (n-1)/n (all-gather) or 1 (broadcast).",
            ["op", "bytes"],
            registry=r,
        )
        self.latency = Gauge(
            "mlbench_collective_latency_seconds",
            "Seconds of one iteration after a barrier (slowest rank), at the quantile.",
            ["op", "bytes", "quantile"],
            registry=r,
        )

    def serve(self, port: int) -> None:
        """Start the endpoint on ``port`` (all interfaces); ``0`` means metrics are off."""
        if port:
            start_http_server(port, registry=self.registry)
