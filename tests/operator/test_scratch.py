"""The run's pods' scratch space (issue 33): the ssh private keys and their copies only in memory, never on the
node's disk; ``/dev/shm`` and the output emptyDir bounded by the operator's settings (pure builders)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mlbench_api import contract
from mlbench_operator import runcontext, runpods
from mlbench_operator.env import SettingsError
from mlbench_operator.run import admission
from mlbench_operator.settings import OperatorConfig, ScratchLimits
from tests.operator import helpers as h

Obj = dict[str, Any]


def ctx_for() -> runcontext.RunContext:
    result = admission.admit(h.run(), h.task(), policy=h.PERMISSIVE)
    assert not isinstance(result, admission.Rejection), result
    return result[0]


def pods(ctx: runcontext.RunContext) -> dict[str, Obj]:
    return {"worker": runpods.worker_pod(ctx, 0, 0), "launcher": runpods.launcher_pod(ctx, 0)}


def volume_at(pod: Obj, path: str) -> Obj:
    """The volume mounted at ``path`` in every container of ``pod`` that mounts it (init containers included)."""
    spec = pod["spec"]
    names = {
        m["name"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]
        for m in c.get("volumeMounts", [])
        if m["mountPath"] == path
    }
    assert len(names) == 1, f"{path}: mounted from {names}"
    (volume,) = [v for v in spec["volumes"] if v["name"] in names]
    return volume


@pytest.mark.parametrize("role", ["worker", "launcher"])
def test_the_key_copies_live_in_memory(role: str) -> None:
    """sshd's host key and the client key are copied (0600) where sshd and ssh accept them: a memory-backed
    emptyDir, bounded; the Secret itself is a tmpfs mount of the kubelet's."""
    pod = pods(ctx_for())[role]
    scratch = volume_at(pod, contract.SSH_SCRATCH_DIR)
    assert scratch["emptyDir"] == {"medium": "Memory", "sizeLimit": runpods.SSH_SCRATCH_SIZE}
    assert "secret" in volume_at(pod, contract.SSH_DIR)


def test_the_worker_copies_its_keys_into_the_memory_scratch() -> None:
    script = runpods.worker_script(ctx_for())
    assert f"d={contract.SSH_SCRATCH_DIR}\n" in script
    assert f'> "$d/{contract.SSH_PRIVATE_KEY}"' in script
    assert '> "$d/host_key"' in script


@pytest.mark.parametrize(
    ("limits", "shm", "output"),
    [(ScratchLimits(), "1Gi", "1Gi"), (ScratchLimits(shm="8Gi", output="256Mi"), "8Gi", "256Mi")],
)
def test_shm_and_output_are_bounded(limits: ScratchLimits, shm: str, output: str) -> None:
    ctx = dataclasses.replace(ctx_for(), scratch=limits)
    worker, launcher = pods(ctx).values()
    assert volume_at(worker, "/dev/shm")["emptyDir"] == {"medium": "Memory", "sizeLimit": shm}
    for pod in (worker, launcher):
        assert volume_at(pod, contract.OUTPUT_DIR)["emptyDir"] == {"sizeLimit": output}


def test_no_emptydir_is_unbounded() -> None:
    for pod in pods(ctx_for()).values():
        unbounded = [v["name"] for v in pod["spec"]["volumes"] if "emptyDir" in v and "sizeLimit" not in v["emptyDir"]]
        assert unbounded == []


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ScratchLimits("1Gi", "1Gi")),
        ({"MLBENCH_SHM_SIZE_LIMIT": " 16Gi ", "MLBENCH_OUTPUT_SIZE_LIMIT": ""}, ScratchLimits("16Gi", "1Gi")),
        ({"MLBENCH_OUTPUT_SIZE_LIMIT": "500M"}, ScratchLimits("1Gi", "500M")),
    ],
)
def test_limits_from_the_environment(env: dict[str, str], expected: ScratchLimits) -> None:
    assert OperatorConfig.from_env(env).scratch == expected


@pytest.mark.parametrize("key", ["MLBENCH_SHM_SIZE_LIMIT", "MLBENCH_OUTPUT_SIZE_LIMIT"])
def test_a_bad_limit_names_the_variable(key: str) -> None:
    with pytest.raises(SettingsError, match=f"{key}='lots' is not a storage quantity"):
        ScratchLimits.from_env({key: "lots"})
