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

from mlbench_operator.policy import DEFAULT_RUNNER_IMAGE

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
def test_push_refuses_the_default_repository() -> None:
    out = images_sh("push")
    assert out.returncode != 0
    assert "set IMAGE_REPO to your registry" in out.stderr


def _operator_env() -> dict[str, Any]:
    docs = yaml.safe_load_all((REPO / "manifests" / "operator" / "deployment.yaml").read_text())
    deployment = next(d for d in docs if d and d.get("kind") == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.multiproc
def test_the_default_runner_image_is_the_one_images_sh_builds() -> None:
    runner = images_sh("tags").stdout.split()[1]
    assert runner == DEFAULT_RUNNER_IMAGE == _operator_env()["MLBENCH_RUNNER_IMAGE"]


def test_the_catalog_names_no_image() -> None:
    for path in sorted((REPO / "manifests" / "catalog").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "BenchmarkTask":
                assert "image" not in (doc["spec"].get("runner") or {}), path.name
