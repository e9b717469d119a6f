"""Leaving the process group: ranks that end normally meet first, an aborting rank does not wait.

Two real gloo ranks in spawned processes. Rank 1 reaches ``close`` late (it writes a marker file
as it does); rank 0 records, right after its own ``close`` returned, whether that marker was
already there, which says whether rank 0 waited for it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import torch.distributed as dist

from mlbench_runner import comm as comm_module
from mlbench_runner.comm import TorchCommunicator, close_quietly
from mlbench_runner.world import World

from .helpers import join_all, spawn_ranks

pytestmark = pytest.mark.multiproc


class Scenario(NamedTuple):
    orderly: tuple[bool, bool]  #: each rank's ``close(orderly)``
    delay: float  #: rank 1's delay before it closes
    timeout: float  #: the closing barrier's


SCENARIOS = {
    "both end normally": Scenario((True, True), 1.0, 60.0),
    "rank 0 aborts": Scenario((False, True), 2.0, 3.0),
    "rank 1 never comes in time": Scenario((True, False), 4.0, 1.0),
}


def _rank(rank: int, port: int, out: str, scenario: str) -> None:
    orderly, delay, timeout = SCENARIOS[scenario]
    comm_module.CLOSE_BARRIER_SECONDS = timeout
    folder = Path(out)
    comm = TorchCommunicator(World(rank, 2, rank, 2, "127.0.0.1", port, "env"), "gloo")
    if rank == 1:
        time.sleep(delay)
        (folder / "rank1-closing").touch()
    error = close_quietly(comm, orderly[rank])
    record = {
        "error": error,
        "peer_was_closing": (folder / "rank1-closing").exists(),
        "initialized": dist.is_initialized(),
    }
    (folder / f"rank{rank}.json").write_text(json.dumps(record))
    if rank == 0:  # rank 0 holds the store: stay until rank 1 is done with it
        deadline = time.monotonic() + 30
        while not (folder / "rank1.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def _close(tmp_path: Path, scenario: str) -> list[dict[str, object]]:
    join_all(spawn_ranks(_rank, str(tmp_path), scenario), timeout=90)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.timeout(120)
def test_ranks_that_end_normally_leave_together(tmp_path: Path) -> None:
    rank0, rank1 = _close(tmp_path, "both end normally")
    assert rank0["peer_was_closing"], "rank 0 left before rank 1 had finished: no closing barrier"
    assert rank0["error"] is None
    assert rank1["error"] is None
    assert not rank0["initialized"]
    assert not rank1["initialized"]


@pytest.mark.timeout(120)
def test_an_aborting_rank_does_not_wait_for_its_peers(tmp_path: Path) -> None:
    rank0, rank1 = _close(tmp_path, "rank 0 aborts")
    assert not rank0["peer_was_closing"], "an aborting rank waited for its peer"
    assert rank0["error"] is None
    # rank 1 ended normally but its peer had gone: its bounded barrier fails, and it still leaves
    assert rank1["error"] is not None
    assert not rank1["initialized"]


@pytest.mark.timeout(120)
def test_the_closing_barrier_is_bounded_and_the_group_is_left_anyway(tmp_path: Path) -> None:
    rank0, rank1 = _close(tmp_path, "rank 1 never comes in time")
    assert not rank0["peer_was_closing"], "rank 0 should have given up after its 1 s timeout"
    error = rank0["error"]
    assert isinstance(error, str)
    assert re.search(r"Ranks? 1 failed to pass monitoredBarrier", error), error  # names the missing rank
    assert not rank0["initialized"], "the group is destroyed even when the barrier fails"
    assert rank1["error"] is None
