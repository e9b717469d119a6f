"""Task 0a's table as text (nccl-tests-like), without torch: what ``mlbench results`` prints for a
collectives run (the sweep itself is :mod:`mlbench_runner.rank.collectives`)."""

from __future__ import annotations

from mlbench_api.results import CollectiveResult


def format_rate(bytes_per_second: float) -> str:
    """GB/s as nccl-tests prints them (10^9 bytes)."""
    return f"{bytes_per_second / 1e9:.3f}"


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def format_table(result: CollectiveResult) -> str:
    """The sweep as nccl-tests-like text: one line per (operation, size), times in microseconds."""
    head = (
        f"# {result.backend}, {result.world_size} ranks, {result.device}\n"
        f"{'op':<11} {'size':>10} {'bytes':>11} {'iters':>5} {'time(us)':>11} {'algbw(GB/s)':>11} "
        f"{'busbw(GB/s)':>11} {'p50(us)':>10} {'p90(us)':>10} {'p99(us)':>10}"
    )
    lines = [head]
    for r in result.rows:
        lines.append(
            f"{r.op:<11} {format_size(r.bytes):>10} {r.bytes:>11} {r.iterations:>5} {r.time_seconds * 1e6:>11.1f} "
            f"{format_rate(r.algorithm_bandwidth):>11} {format_rate(r.bus_bandwidth):>11} "
            f"{r.latency_p50_seconds * 1e6:>10.1f} {r.latency_p90_seconds * 1e6:>10.1f} "
            f"{r.latency_p99_seconds * 1e6:>10.1f}"
        )
    return "\n".join(lines)
