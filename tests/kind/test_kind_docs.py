"""The kind recipe as docs/install.md writes it ("A first run on kind"), checked against what it names: the images
it loads are the ones ``hack/images.sh`` builds, its cluster and node names are manifests/kind/cluster.yaml's as kind
names nodes, the files it applies exist, ``manifests/kind`` renders with the dataset volume and the operator's
settings agreeing (read by the operator's own parser), and the node image is the one the config pins, at a
Kubernetes minor the README allows. kind itself reads the config in test_kind_config.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from typing import Any

import pytest
import yaml
from kubernetes.utils import parse_quantity

from mlbench_operator.settings import DatasetSettings
from tests.cluster.cluster import kubectl_path
from tests.cluster.kind import REPO

pytestmark = pytest.mark.multiproc

DOCS = REPO / "docs" / "install.md"
HEADING = "## A first run on kind"
CONFIG = REPO / "manifests" / "kind" / "cluster.yaml"
Obj = dict[str, Any]


def section() -> str:
    text = DOCS.read_text()
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start : end if end > 0 else None]


def commands() -> list[str]:
    """The section's shell lines, comments cut, continuation lines joined."""
    blocks = re.findall(r"```sh\n(.*?)```", section(), flags=re.S)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


def config() -> Obj:
    loaded: Obj = yaml.safe_load(CONFIG.read_text())
    return loaded


def node_names(cfg: Obj, role: str) -> list[str]:
    """kind's node names: <cluster>-<role>, then <cluster>-<role>2, 3, ... (the control plane: control-plane)."""
    count = sum(1 for n in cfg["nodes"] if n["role"] == role)
    return [f"{cfg['name']}-{role}{i + 1 if i else ''}" for i in range(count)]


@cache
def built_images() -> tuple[str, ...]:
    env = {k: v for k, v in os.environ.items() if k not in ("IMAGE_REPO", "MLBENCH_IMAGE_TAG")}
    out = subprocess.run(
        [str(REPO / "hack" / "images.sh"), "tags"], capture_output=True, text=True, env=env, check=True, timeout=60
    )
    return tuple(out.stdout.split())


def kubectl() -> str:
    """$MLBENCH_KUBECTL, else the test cluster's (make k8s-bins), else PATH's."""
    found = os.environ.get("MLBENCH_KUBECTL") or (str(kubectl_path()) if kubectl_path().exists() else None)
    found = found or shutil.which("kubectl")
    assert found, "no kubectl: MLBENCH_KUBECTL, `make k8s-bins` or PATH"
    return found


@cache
def rendered() -> tuple[Obj, ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(REPO / "manifests" / "kind")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def one(kind: str, name: str) -> Obj:
    (found,) = [d for d in rendered() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_the_loaded_images_are_the_ones_make_images_builds() -> None:
    loads = [c for c in commands() if c.startswith("kind load docker-image")]
    assert len(loads) == 1
    assert tuple(w for w in loads[0].split() if "/" in w) == built_images()
    podman = re.search(r"for image in (.*?); do", section())
    assert podman is not None, "the podman loop is gone"
    assert tuple(podman.group(1).split()) == built_images()
    said = re.search(r"^make images +# (.*)$", section(), flags=re.M)
    assert said is not None
    assert tuple(said.group(1).split(", ")) == built_images()


def test_the_cluster_and_node_names_are_the_configs() -> None:
    cfg, cmds = config(), commands()
    workers = ",".join(node_names(cfg, "worker"))
    kinds = [c for c in cmds if c.startswith("kind ") and not c.startswith("kind create")]
    assert kinds
    for cmd in kinds:
        assert re.search(rf"--name {cfg['name']}(\s|$)", cmd), cmd
        if " load " in cmd:
            assert f"--nodes {workers} " in cmd, cmd
    assert workers.count(",") == 1  # two workers: the run's two ranks can sit on different nodes


def test_the_files_it_names_exist() -> None:
    paths = [p for c in commands() for p in re.findall(r"(?:--config|-k|-f) (\S+)", c) if not p.startswith("/")]
    assert "manifests/kind/cluster.yaml" in paths
    assert "manifests/kind" in paths
    for path in paths:
        assert (REPO / path).exists(), path
    crds = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in (REPO / "crds" / "bases").glob("mlbench.io_*")}
    (wait,) = [c for c in commands() if c.startswith("kubectl wait")]
    assert set(re.findall(r"crd/(\S+)", wait)) == crds


def test_the_host_directory_is_the_one_both_workers_mount() -> None:
    (mkdir,) = [c for c in commands() if c.startswith("mkdir")]
    directory = mkdir.split()[2]
    assert f"chmod 0777 {directory}" in mkdir
    workers = [n for n in config()["nodes"] if n["role"] == "worker"]
    assert [m["hostPath"] for n in workers for m in n["extraMounts"]] == [directory] * len(workers)


def test_the_dataset_volume_is_what_the_operator_asks_for() -> None:
    (deployment,) = [d for d in rendered() if d["kind"] == "Deployment"]
    env_list = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env_list]
    assert len(names) == len(set(names)), "a variable set twice"
    settings = DatasetSettings.from_env({e["name"]: e["value"] for e in env_list if "value" in e})
    pv = one("PersistentVolume", "mlbench-kind-datasets")["spec"]
    assert one("StorageClass", settings.storage_class)
    assert pv["storageClassName"] == settings.storage_class
    assert settings.access_mode == "ReadWriteMany"
    assert pv["accessModes"] == [settings.access_mode]
    assert parse_quantity(pv["capacity"]["storage"]) >= parse_quantity(settings.size)
    mounts = {m["containerPath"] for n in config()["nodes"] for m in n.get("extraMounts", [])}
    assert mounts == {pv["hostPath"]["path"]}


def test_the_operator_runs_the_loaded_images() -> None:
    operator, runner = built_images()
    (deployment,) = [d for d in rendered() if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == operator
    assert {"name": "MLBENCH_RUNNER_IMAGE", "value": runner} in container["env"]
    assert "imagePullPolicy" not in container  # IfNotPresent for a version tag: the side-loaded image is used
    assert not operator.endswith(":latest")
    assert not runner.endswith(":latest")


def test_the_node_image_is_pinned_at_a_supported_minor() -> None:
    images = {n["image"] for n in config()["nodes"]}
    (image,) = images
    assert re.fullmatch(r"kindest/node:v1\.\d+\.\d+@sha256:[0-9a-f]{64}", image)
    assert f"`{image}`" in section()
    floor = re.search(r"\*\*Kubernetes 1\.(\d+) or newer\.\*\*", (REPO / "README.md").read_text())
    assert floor is not None
    minor = int(image.split(":v1.")[1].split(".")[0])
    assert minor >= int(floor.group(1))


def test_the_readme_links_the_recipe() -> None:
    anchor = HEADING.removeprefix("## ").lower().replace(" ", "-")
    assert f"docs/install.md#{anchor}" in (REPO / "README.md").read_text()
