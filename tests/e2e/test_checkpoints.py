"""A checkpointing run on the real node(s): a killed worker's gang resumes from the last epoch's checkpoint,
in new pods, instead of starting over; the result says it resumed, and its clock counts the restart.

Not run by the author of this file (the cluster belongs to another session): run with the e2e suite.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from mlbench_runner.pod.launch import strip_tag
from tests.cluster.node import SHARED_STORAGE_CLASS
from tests.e2e.conftest import E2E, wait_training

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.e2e, pytest.mark.slow]


def _checkpoint_claim(e2e: E2E, name: str) -> str:
    """A ReadWriteMany claim every worker mounts (the workers may sit on either real node)."""
    e2e.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": e2e.namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": SHARED_STORAGE_CLASS,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )
    return name


def _events(log: str, name: str) -> list[dict[str, Any]]:
    """The rank-0 events called ``name`` in a launcher's log (mpirun's tags dropped)."""
    found = []
    for line in log.splitlines():
        text = strip_tag(line)
        if f'"{name}"' in text and text.startswith("{"):
            event = json.loads(text)
            if event.get("event") == name:
                found.append(event)
    return found


def _epoch_checkpointed(e2e: E2E, run: str) -> None:
    """Wait until rank 0 has written a checkpoint (its event reaches the launcher's log through mpirun)."""
    e2e.wait_status(
        run,
        lambda s: s.get("phase") == "Running" and '"checkpoint_saved"' in e2e.logs(f"{run}-launcher"),
        600,
        "the first epoch's checkpoint",
    )


def test_a_killed_workers_gang_resumes_from_the_last_epoch(e2e: E2E, e2e_task: str) -> None:
    claim = _checkpoint_claim(e2e, "e2e-checkpoints")
    task = e2e.unreachable_goal(e2e_task)
    run = e2e.run("resumed", task, checkpoint={"claimName": claim})
    wait_training(e2e, run)
    _epoch_checkpointed(e2e, run)
    epoch = _events(e2e.logs(f"{run}-launcher"), "checkpoint_saved")[-1]["epoch"]
    killed = time.time()
    e2e.kill_container(f"{run}-worker-1")
    st = e2e.wait_finished(run)
    assert st.get("phase") == "Succeeded", f"{json.dumps(st)[:2000]}\n{e2e.debug(run)}"
    assert st["result"]["epochs"] == 3, json.dumps(st["result"])  # every epoch, none twice: the goal is out of reach
    assert st["restarts"] == 1, json.dumps(st)[:2000]
    assert st["result"]["resumes"] == 1, json.dumps(st["result"])
    log = e2e.logs(f"{run}-launcher")  # the second attempt's launcher
    resumed = _events(log, "checkpoint_resumed")
    assert resumed, log[-3000:]
    assert resumed[0]["epoch"] >= epoch  # from the last epoch written before the kill, not from epoch 0
    started = [e["epoch"] for e in _events(log, "epoch_start")]
    assert started, log[-3000:]
    assert min(started) == resumed[0]["epoch"] + 1  # the epochs before were not trained again
    # the clock runs from the first attempt's start: everything since the kill is in it
    assert st["result"]["wallClockSeconds"] >= time.time() - killed - 60
