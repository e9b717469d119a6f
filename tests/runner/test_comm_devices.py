"""The torch communicator's collectives and gossip exchange on each device gloo takes: two real gloo ranks.

gloo's collectives stage device tensors themselves, its point-to-point calls do not (the communicator
stages those through host memory, :func:`mlbench_runner.comm.host_staged`). The ``cuda`` cases need a GPU:
they run on the GPU machine (``hack/gpu-check.sh``) and are skipped elsewhere; the ``cpu`` cases run
everywhere and check the same values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mlbench_runner import comm as comm_module
from mlbench_runner.comm import TorchCommunicator, close_quietly
from mlbench_runner.world import World

from .helpers import join_all, spawn_ranks

#: A device, or ``cpu-staged``: the exchange forced through the host staging, which runs the staging branch
#: on CPU tensors, so that its code (a contiguous host copy of a transposed tensor) is tested without a GPU.
CASES = [
    "cpu",
    "cpu-staged",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")),
]


def _rank(rank: int, port: int, out: str, case: str) -> None:
    """Each call with rank-dependent input; records the values and the device each result is on."""
    device = case.removesuffix("-staged")
    if case.endswith("-staged"):
        comm_module.host_staged = lambda backend, device: True  # this spawned process only
    comm = TorchCommunicator(World(rank, 2, rank, 2, "127.0.0.1", port, "env"), "gloo")
    dev = torch.device(device)
    summed = torch.full((3,), float(rank + 1), device=dev)
    comm.all_reduce_sum_(summed)
    sent = torch.arange(4.0, device=dev) * (rank + 1)
    comm.broadcast_(sent, src=1)
    gathered = comm.all_gather(torch.tensor([float(rank), 10.0 + rank], device=dev))
    # a transposed (not contiguous) tensor, as a parameter view can be
    mine = (torch.arange(6.0, device=dev).reshape(2, 3) + 100 * rank).t()
    received = comm.exchange(mine, [1 - rank])
    results = {"all_reduce": summed, "broadcast": sent, "all_gather": gathered, "exchange": received[0]}
    record: dict[str, object] = {
        name: {"value": t.cpu().tolist(), "device": t.device.type} for name, t in results.items()
    }
    record["close_error"] = close_quietly(comm, True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))


@pytest.mark.multiproc
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES)
def test_gloo_collectives_and_exchange_on_each_device(tmp_path: Path, case: str) -> None:
    join_all(spawn_ranks(_rank, str(tmp_path), case), timeout=100)
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record.pop("close_error") is None
        assert {name: r["device"] for name, r in record.items()} == dict.fromkeys(record, case.removesuffix("-staged"))
        values = {name: r["value"] for name, r in record.items()}
        peer = 1 - rank
        assert values == {
            "all_reduce": [3.0, 3.0, 3.0],
            "broadcast": [0.0, 2.0, 4.0, 6.0],
            "all_gather": [[0.0, 10.0], [1.0, 11.0]],
            "exchange": (torch.arange(6.0).reshape(2, 3) + 100 * peer).t().tolist(),
        }
