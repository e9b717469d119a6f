"""``make release``: dist/install.yaml in an order one apply can follow (CRDs first, every custom resource after its
CRD), both images at IMAGE_REPO, and only for pyproject's version with a CHANGELOG.md entry."""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hack_release", REPO / "hack" / "release.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


release = _load()
Obj = dict[str, Any]


def _files(*dirs: str) -> Iterator[Path]:
    for d in dirs:
        yield from sorted(p for p in (REPO / d).glob("*.yaml") if p.name != "kustomization.yaml")


LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _read_docs() -> tuple[Obj, ...]:
    dirs = ("crds/bases", "manifests/catalog", "manifests/operator", "manifests/policy")
    return tuple(d for p in _files(*dirs) for d in yaml.load_all(p.read_text(), Loader=LOADER) if d)


def shipped_docs() -> list[Obj]:
    """The documents of the release's bases, read from their files (what kustomize renders, without a process)."""
    return copy.deepcopy(list(_read_docs()))


EXPECTED_KINDS = [
    "CustomResourceDefinition",
    "Namespace",
    "ServiceAccount|ClusterRole|ClusterRoleBinding|Role|RoleBinding",
    "NetworkPolicy|Service|Deployment|PodDisruptionBudget",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "BenchmarkTask",
]


def groups(docs: list[Obj]) -> list[str]:
    """The sequence of EXPECTED_KINDS groups the documents fall in, consecutive repeats merged."""
    out: list[str] = []
    for doc in docs:
        (group,) = [g for g in EXPECTED_KINDS if doc["kind"] in g.split("|")]
        if not out or out[-1] != group:
            out.append(group)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_order_is_crds_namespace_rbac_operator_policy_catalog(seed: int) -> None:
    docs = shipped_docs()
    random.Random(seed).shuffle(docs)
    ordered = release.order(docs)
    assert groups(ordered) == EXPECTED_KINDS
    assert release.misplaced_uses(ordered) == []
    assert sorted(map(id, ordered)) == sorted(map(id, docs))  # nothing lost, nothing added


def test_a_custom_resource_before_its_crd_is_named() -> None:
    docs = release.order(shipped_docs())
    task = next(d for d in docs if d["kind"] == "BenchmarkTask")
    moved = [task, *[d for d in docs if d is not task]]
    (problem,) = release.misplaced_uses(moved)
    assert f"document 0 (BenchmarkTask {task['metadata']['name']!r}) comes before its CRD" == problem
    no_crds = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    assert "without a CRD in the file" in release.misplaced_uses(no_crds)[0]


def test_an_unknown_kind_has_no_place() -> None:
    with pytest.raises(release.ReleaseError, match="CronJob 'x': no place in the install order"):
        release.order([{"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "x"}}])


def test_retarget_points_both_images_and_the_allowlist_at_image_repo() -> None:
    docs = release.retarget(shipped_docs(), "registry.example.com/team/", "1.2.3")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/team/mlbench-operator:1.2.3"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLBENCH_RUNNER_IMAGE"] == "registry.example.com/team/mlbench-runner:1.2.3"
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    (images,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "allowedImages"]
    assert images == (
        "['registry.example.com/team/mlbench-runner:*', 'registry.example.com/team/mlbench-runner@sha256:*']"
    )
    without_policy = [d for d in shipped_docs() if d["kind"] != "ValidatingAdmissionPolicy"]
    with pytest.raises(release.ReleaseError, match="policy"):
        release.retarget(without_policy, "r/t", "1.2.3")


@pytest.mark.parametrize(
    ("version", "project", "changelog", "needle"),
    [
        ("1.2", "1.2", "## [1.2]", "is not x.y.z"),
        ("1.2.4", "1.2.3", "## [1.2.4] - 2026-11-29", "bump it there first"),
        ("1.2.3", "1.2.3", "## [1.2.30] - 2026-11-29\n## [Unreleased]", "no entry for 1.2.3"),
        ("1.2.3", "1.2.3", "- 1.2.3 fixed", "no entry for 1.2.3"),
        ("1.2.3", "1.2.3", "# Changelog\n\n## [1.2.3] - 2026-11-29\n", None),
        ("1.2.3", "1.2.3", "## 1.2.3\n", None),
    ],
)
def test_a_release_needs_pyprojects_version_and_its_changelog_entry(
    version: str, project: str, changelog: str, needle: str | None
) -> None:
    if needle is None:
        release.check_version(version, project, changelog)
    else:
        with pytest.raises(release.ReleaseError, match=needle):
            release.check_version(version, project, changelog)


def test_the_current_version_has_its_changelog_entry() -> None:
    release.check_version(release.project_version(), release.project_version(), (REPO / "CHANGELOG.md").read_text())


@pytest.mark.multiproc
def test_make_release_writes_one_ordered_file(tmp_path: Path) -> None:
    kubectl = os.environ.get("MLBENCH_KUBECTL") or shutil.which("kubectl")
    if not kubectl:
        pytest.skip("no kubectl (MLBENCH_KUBECTL or PATH)")
    out = tmp_path / "install.yaml"
    cmd = [sys.executable, str(REPO / "hack" / "release.py"), "--version", release.project_version()]
    cmd += ["--image-repo", "x/y", "--kubectl", kubectl, "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
    docs = [d for d in yaml.load_all(out.read_text(), Loader=LOADER) if d]
    assert groups(docs) == EXPECTED_KINDS
    assert release.misplaced_uses(docs) == []
    catalog = {d["metadata"]["name"] for d in docs if d["kind"] == "BenchmarkTask"}
    assert catalog == {d["metadata"]["name"] for d in shipped_docs() if d["kind"] == "BenchmarkTask"}
    assert "x/y/mlbench-operator:" in out.read_text()
    refused = subprocess.run([*cmd[:3], "9.9.9", *cmd[4:]], check=False, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert "bump it there first" in refused.stderr
