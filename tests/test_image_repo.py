"""One setting names where both images live: ``make images IMAGE_REPO=...`` tags them there, ``make push`` pushes
them (never to the default, which is for side-loaded images only), and the operator's MLBENCH_RUNNER_IMAGE is the
one runner image that manifests, catalog and admission follow."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_operator.policy import DEFAULT_IMAGE_REPO, DEFAULT_RUNNER_IMAGE, normalize_image

REPO = Path(__file__).resolve().parents[1]


def images_sh(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "hack" / "images.sh"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "IMAGE_REPO": "", **env},
        check=False,
        timeout=60,
    )


@pytest.mark.multiproc
def test_image_repo_names_both_images() -> None:
    out = images_sh("tags", IMAGE_REPO="registry.example.com/team/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "registry.example.com/team/mlbench-operator:0.1.0",
        "registry.example.com/team/mlbench-runner:0.1.0",
    ]


@pytest.mark.multiproc
def test_make_images_and_push_name_image_repo_for_both_images() -> None:
    for target in ("images", "push"):
        out = subprocess.run(
            ["make", "-n", "--no-print-directory", target, "IMAGE_REPO=x/y"],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=True,
            timeout=60,
        )
        (command,) = [line for line in out.stdout.splitlines() if "hack/images.sh" in line]
        assert command.startswith("IMAGE_REPO=x/y "), command
        tags = images_sh("tags", IMAGE_REPO="x/y").stdout.split()
        assert [t.rsplit(":", 1)[0] for t in tags] == ["x/y/mlbench-operator", "x/y/mlbench-runner"]


def test_the_default_repository_is_no_public_registrys_namespace() -> None:
    """Unqualified, ``mlbench/...`` would be Docker Hub's ``mlbench`` namespace, which the project does not own."""
    assert normalize_image(f"{DEFAULT_IMAGE_REPO}/x:1") == f"{DEFAULT_IMAGE_REPO}/x:1"
    assert DEFAULT_IMAGE_REPO.split("/", 1)[0] == "localhost"


@pytest.mark.multiproc
def test_push_refuses_the_default_repository() -> None:
    out = images_sh("push")
    assert out.returncode != 0
    assert "set IMAGE_REPO to your registry" in out.stderr


def _operator_container() -> dict[str, Any]:
    docs = yaml.safe_load_all((REPO / "manifests" / "operator" / "deployment.yaml").read_text())
    deployment = next(d for d in docs if d and d.get("kind") == "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def _operator_env() -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in _operator_container()["env"]}


@pytest.mark.multiproc
def test_the_default_runner_image_is_the_one_images_sh_builds() -> None:
    operator, runner = images_sh("tags").stdout.split()
    assert runner == DEFAULT_RUNNER_IMAGE == _operator_env()["MLBENCH_RUNNER_IMAGE"]
    assert operator == _operator_container()["image"]


def test_the_catalog_names_no_image() -> None:
    for path in sorted((REPO / "manifests" / "catalog").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "BenchmarkTask":
                assert "image" not in (doc["spec"].get("runner") or {}), path.name
