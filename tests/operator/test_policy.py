"""The admin's admission policy: what a run may ask of the cluster (no cluster needed)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mlbench_operator import policy as p
from mlbench_operator.env import SettingsError
from mlbench_operator.run import admission
from tests.operator import helpers as h

DEFAULT = p.AdmissionPolicy()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("ref", "normal"),
    [
        ("mlbench/mlbench-runner:0.1.0", "docker.io/mlbench/mlbench-runner:0.1.0"),
        ("docker.io/mlbench/mlbench-runner:0.1.0", "docker.io/mlbench/mlbench-runner:0.1.0"),
        ("index.docker.io/mlbench/x:1", "docker.io/mlbench/x:1"),
        ("busybox:1.36", "docker.io/library/busybox:1.36"),
        ("registry.example.com:5000/team/runner@sha256:ab", "registry.example.com:5000/team/runner@sha256:ab"),
        ("localhost/runner:dev", "localhost/runner:dev"),
        ("localhost:5000/team/runner:1", "localhost:5000/team/runner:1"),
        ("team/sub/mlbench-runner:1", "docker.io/team/sub/mlbench-runner:1"),
    ],
)
def test_image_references_are_compared_registry_qualified(ref: str, normal: str) -> None:
    assert p.normalize_image(ref) == normal


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("localhost/mlbench/mlbench-runner:0.1.0", True),
        ("localhost/mlbench/mlbench-runner@sha256:" + "a" * 64, True),
        ("localhost/mlbench/mlbench-runner-evil:1", False),  # a prefix is not the repository
        ("mlbench/mlbench-runner:0.1.0", False),  # a Docker Hub namespace the project does not control
        ("evil.example.com/mlbench/mlbench-runner:0.1.0", False),
        ("busybox", False),
    ],
)
def test_default_images_are_the_projects_runner_only(image: str, allowed: bool) -> None:
    assert (p.check_image(image, "spec.image", DEFAULT) == []) is allowed


GPU_ONLY = p.AdmissionPolicy(toleration_keys=("nvidia.com/*",), node_selector_keys=("nvidia.com/*",))


@pytest.mark.parametrize(
    ("name", "patterns", "expected"),
    [
        (None, (), []),  # unset: nothing to check
        ("", ("a",), []),
        ("team-a1", ("team-a*",), []),
        ("team-b", ("team-a*", "x"), ["f.x: 'team-b' is not allowed: the rule (V: team-a*, x)"]),
        ("team-b", (), ["f.x: 'team-b' is not allowed: the rule (V: none)"]),
    ],
)
def test_a_listed_name_is_checked_once_for_every_allowlist(
    name: str | None, patterns: tuple[str, ...], expected: list[str]
) -> None:
    """The one check behind the priority class's and the gang scheduler's allowlists."""
    assert p.check_listed(name, patterns, "f.x", "the rule", "V") == expected


@pytest.mark.parametrize(
    ("scheduling", "policy", "needle"),
    [
        # priority classes: none unless the admin lists them (a tenant's class could preempt every other tenant)
        ({"priorityClassName": "system-node-critical"}, DEFAULT, "priorityClassName: 'system-node-critical'"),
        ({"priorityClassName": "batch-low"}, DEFAULT, "priorityClassName: 'batch-low' is not allowed"),
        ({"priorityClassName": "batch-low"}, DEFAULT, "MLBENCH_ALLOWED_PRIORITY_CLASSES: none"),
        ({"priorityClassName": "batch-low"}, p.AdmissionPolicy(priority_classes=("batch-*",)), None),
        ({"priorityClassName": "batch-high"}, p.AdmissionPolicy(priority_classes=("batch-low",)), "batch-high"),
        ({"priorityClassName": "system-cluster-critical"}, p.AdmissionPolicy(priority_classes=("system-*",)), None),
        # nodeSelector keys: the well-known ones by default, the admin's list otherwise
        ({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}, DEFAULT, "MLBENCH_ALLOW_CONTROL_PLANE"),
        ({"nodeSelector": {"gpu": "h100"}}, DEFAULT, "nodeSelector: 'gpu' key is not allowed"),
        ({"nodeSelector": {"dedicated": "team-a"}}, DEFAULT, "MLBENCH_ALLOWED_NODE_SELECTOR_KEYS"),
        ({"nodeSelector": {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.present": "true"}}, DEFAULT, None),
        ({"nodeSelector": {"nvidia.com/gpu.memory": "80"}}, GPU_ONLY, None),
        ({"nodeSelector": {"kubernetes.io/arch": "amd64"}}, GPU_ONLY, "'kubernetes.io/arch' key is not allowed"),
        ({"nodeSelector": {"node-role.kubernetes.io/master": ""}}, p.AdmissionPolicy(allow_control_plane=True), None),
        # tolerations: only allowlisted keys; keyless (every taint) only with "*"
        ({"tolerations": [{"operator": "Exists"}]}, DEFAULT, "tolerations[0]: tolerates every taint"),
        ({"tolerations": [{"key": "", "operator": "Exists"}]}, DEFAULT, "tolerations[0]: tolerates every taint"),
        ({"tolerations": [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}]}, DEFAULT, "master"),
        (
            {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]},
            DEFAULT,
            "tolerates 'node.kubernetes.io/unschedulable', not allowed "
            "(MLBENCH_ALLOWED_TOLERATION_KEYS: nvidia.com/gpu)",
        ),
        ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}, DEFAULT, None),
        ({"tolerations": [{"key": "nvidia.com/mig", "operator": "Exists"}]}, GPU_ONLY, None),
        (
            {"tolerations": [{"key": "nvidia.com/gpu"}, {"key": "dedicated"}]},
            DEFAULT,
            "tolerations[1]: tolerates 'dedicated'",
        ),
        ({"tolerations": [{"operator": "Exists"}]}, p.AdmissionPolicy(allow_control_plane=True), "every taint"),
        ({"tolerations": [{"operator": "Exists"}]}, p.AdmissionPolicy(toleration_keys=("*",)), None),
        (
            {"tolerations": [{"key": "node-role.kubernetes.io/control-plane"}]},
            p.AdmissionPolicy(allow_control_plane=True),
            None,
        ),
        # a gang's scheduler: the operator's (unset) by default, another only if the admin lists it
        ({"gang": {}}, DEFAULT, None),
        ({"gang": {"scheduleTimeoutSeconds": 60}}, DEFAULT, None),
        (
            {"gang": {"schedulerName": "my-scheduler"}},
            DEFAULT,
            "gang.schedulerName: 'my-scheduler' is not allowed: leave it unset for the operator's gang scheduler, "
            "or the admin lists it (MLBENCH_ALLOWED_SCHEDULER_NAMES: none)",
        ),
        ({"gang": {"schedulerName": "volcano"}}, p.AdmissionPolicy(scheduler_names=("volcano",)), None),
        ({"gang": {"schedulerName": "team-b"}}, p.AdmissionPolicy(scheduler_names=("team-a*",)), "team-a*"),
    ],
)
def test_scheduling_policy(scheduling: dict[str, Any], policy: p.AdmissionPolicy, needle: str | None) -> None:
    found = p.violations("localhost/mlbench/mlbench-runner:1", "spec.image", scheduling, None, policy)
    if needle is None:
        assert found == []
    else:
        assert len(found) == 1, found
        assert needle in found[0], found
        assert found[0].startswith("spec.scheduling."), found  # every refusal names its field


@pytest.mark.parametrize(
    ("volume", "allowed"),
    [
        ({"persistentVolumeClaim": {"claimName": "data"}}, True),
        ({"nfs": {"server": "nfs", "path": "/x"}}, True),
        ({"hostPath": {"path": "/"}}, False),
        ({"name": "data", "hostPath": {"path": "/"}}, False),
        ({"iscsi": {}}, False),
    ],
)
def test_dataset_volume_types(volume: dict[str, Any], allowed: bool) -> None:
    assert (p.check_volume(volume, DEFAULT) == []) is allowed


def test_settings_from_env() -> None:
    pol = p.AdmissionPolicy.from_env(
        {
            "MLBENCH_ALLOWED_IMAGES": "registry.local/runner:*, mlbench/mlbench-runner:*",
            "MLBENCH_ALLOWED_PRIORITY_CLASSES": "bench-*",
            "MLBENCH_ALLOWED_VOLUME_TYPES": "persistentVolumeClaim,hostPath",
            "MLBENCH_ALLOWED_NODE_SELECTOR_KEYS": "dedicated, kubernetes.io/*",
            "MLBENCH_ALLOWED_TOLERATION_KEYS": "dedicated",
            "MLBENCH_ALLOW_CONTROL_PLANE": "true",
        }
    )
    assert pol.node_selector_keys == ("dedicated", "kubernetes.io/*")
    assert pol.toleration_keys == ("dedicated",)
    assert pol.images == ("registry.local/runner:*", "docker.io/mlbench/mlbench-runner:*")
    assert pol.priority_classes == ("bench-*",)
    assert pol.volume_types == ("persistentVolumeClaim", "hostPath")
    assert pol.allow_control_plane
    assert p.AdmissionPolicy.from_env({}) == DEFAULT
    assert (
        p.check_image("anything/at:all", "spec.image", p.AdmissionPolicy.from_env({"MLBENCH_ALLOWED_IMAGES": "*"}))
        == []
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"MLBENCH_ALLOW_CONTROL_PLANE": "yes"}, "MLBENCH_ALLOW_CONTROL_PLANE"),
        ({"MLBENCH_ALLOWED_IMAGES": "a,,b"}, "MLBENCH_ALLOWED_IMAGES"),
        # a class means one thing in the admission policy's regex and another in fnmatch: refused
        ({"MLBENCH_ALLOWED_IMAGES": "docker.io/mlbench/[!x]*"}, r"MLBENCH_ALLOWED_IMAGES: .*only \* and \?"),
        ({"MLBENCH_ALLOWED_PRIORITY_CLASSES": "batch-[ab]"}, "MLBENCH_ALLOWED_PRIORITY_CLASSES"),
        ({"MLBENCH_ALLOWED_TOLERATION_KEYS": "a,,b"}, "MLBENCH_ALLOWED_TOLERATION_KEYS"),
        ({"MLBENCH_ALLOWED_NODE_SELECTOR_KEYS": "[ab]"}, "MLBENCH_ALLOWED_NODE_SELECTOR_KEYS"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        p.AdmissionPolicy.from_env(env)


def test_admission_refuses_with_every_field_named_and_creates_nothing() -> None:
    run = h.run(
        image="evil.example.com/miner:1",
        scheduling={"priorityClassName": "system-node-critical", "tolerations": [{"operator": "Exists"}]},
    )
    result = admission.admit(run, h.task())
    assert isinstance(result, admission.Rejection)
    assert result.reason == "PolicyViolation"
    for needle in ("spec.image", "priorityClassName", "tolerations[0]"):
        assert needle in result.message
    status = admission.rejected_status(run, result, T0)
    assert status["phase"] == "Failed"


def test_task_image_is_checked_and_named() -> None:
    task = h.task()
    task["spec"]["runner"]["image"] = "docker.io/library/python:3.11"
    result = admission.admit(h.run(), task)
    assert isinstance(result, admission.Rejection)
    assert f"BenchmarkTask '{h.TASK_NAME}' runner.image" in result.message
