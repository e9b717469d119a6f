"""A collectives task's ``spec.collectives``: the operations and message sizes the collectives benchmark sweeps."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from mlbench_api.common import (
    ApiModel,
    cel,
)


class CollectiveOp(StrEnum):
    """A collective timed by a collectives task (the names of nccl-tests' all_reduce_perf etc.)."""

    ALL_REDUCE = "all-reduce"  #: sum all-reduce of a float32 buffer of S bytes
    ALL_GATHER = "all-gather"  #: every rank contributes S/n bytes; S bytes (the gathered total) land on every rank
    BROADCAST = "broadcast"  #: rank 0's S bytes to every rank


#: Largest message of a collectives sweep (1 GiB): every rank holds two buffers of this size.
MAX_COLLECTIVE_BYTES = 1 << 30
#: Bytes of one element of the sweep's dtype (float32).
COLLECTIVE_ELEMENT_BYTES = 4


class CollectiveBenchmark(ApiModel):
    """Task 0a: time the backend's collectives over message sizes minBytes, minBytes*factor, ... up to maxBytes.

    For each operation and size: warmupIterations untimed, then iterations back to back (the mean time gives
    nccl-tests' algbw = S/t and busbw), then iterations each after a barrier (the latency percentiles).
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.minBytes) || !has(self.maxBytes) || self.minBytes <= self.maxBytes",
                    "minBytes must not exceed maxBytes",
                    ".minBytes",
                ),
                cel(
                    "!has(self.operations) || self.operations.all(o, self.operations.filter(p, p == o).size() == 1)",
                    "operations must not repeat",
                    ".operations",
                ),
            ]
        }
    )

    operations: Annotated[list[CollectiveOp], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: list(CollectiveOp)
    )
    """Collectives to time, in this order: all-reduce, all-gather, broadcast (default all three, no repeats)."""
    min_bytes: Annotated[
        int, Field(ge=COLLECTIVE_ELEMENT_BYTES, le=MAX_COLLECTIVE_BYTES, multiple_of=COLLECTIVE_ELEMENT_BYTES)
    ] = 4
    """Smallest message in bytes (default 4, one float32); a multiple of 4."""
    max_bytes: Annotated[
        int, Field(ge=COLLECTIVE_ELEMENT_BYTES, le=MAX_COLLECTIVE_BYTES, multiple_of=COLLECTIVE_ELEMENT_BYTES)
    ] = 256 * 1024 * 1024
    """Largest message in bytes (default 268435456 = 256 MiB, at most 1 GiB); a multiple of 4, always timed."""
    factor: Annotated[int, Field(ge=2, le=1024)] = 2
    """Each size is the previous one times factor (nccl-tests' -f, default 2); maxBytes ends the ladder."""
    iterations: Annotated[int, Field(ge=1, le=10_000)] = 20
    """Timed iterations per size and phase (nccl-tests' -n, default 20); fewer where maxSecondsPerSize says so."""
    warmup_iterations: Annotated[int, Field(ge=1, le=1000)] = 5
    """Untimed iterations before each size (nccl-tests' -w, default 5); they also estimate the time per iteration."""
    max_seconds_per_size: Annotated[float, Field(gt=0, le=3600)] = 10.0
    """Time budget of one size's two timed phases in seconds (default 10, at most 3600): from the warm-up's time per
    iteration, iterations is lowered (to 1 at least) so that both phases fit, which bounds huge messages on slow
    networks. A fast network never hits it."""
    dtype: Literal["float32"] = "float32"
    """Element type of the buffers (float32 only; all-reduce sums)."""

    @model_validator(mode="after")
    def _rules(self) -> CollectiveBenchmark:
        if self.min_bytes > self.max_bytes:
            raise ValueError("minBytes: must not exceed maxBytes")
        if len(set(self.operations)) != len(self.operations):
            raise ValueError("operations: must not repeat")
        return self

    def sizes(self) -> list[int]:
        """The message sizes in bytes: minBytes * factor^k below maxBytes, then maxBytes (increasing, no repeats)."""
        return size_ladder(self.min_bytes, self.max_bytes, self.factor)


def size_ladder(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """``min_bytes, min_bytes*factor, ...`` while below ``max_bytes``, then ``max_bytes`` itself."""
    if not 0 < min_bytes <= max_bytes or factor < 2:
        raise ValueError(f"size ladder: need 0 < min ({min_bytes}) <= max ({max_bytes}) and factor ({factor}) >= 2")
    sizes = []
    size = min_bytes
    while size < max_bytes:
        sizes.append(size)
        size *= factor
    return [*sizes, max_bytes]
