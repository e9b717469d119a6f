"""manifests/kind/cluster.yaml through kind v0.33.0 itself: ``kind create cluster --config`` loads it strictly,
defaults and validates it, and plans the node containers, which a stand-in podman records instead of starting
(tests/cluster/kind.py). No cluster is created: this machine has no Docker engine, and kind's node image cannot be
pulled here (docs/install.md, "A first run on kind", says what was and was not checked).

The kind binary is built from its Go module by tests/cluster/build-kind.sh on first use (about a minute on two
cores, cached by version); ``make test`` starts that build in the background (tests/cluster/cluster.mk, k8s-bins),
so in CI it is usually done, or being finished under the build's lock, when these tests ask for it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.kind import REPO, create_cluster

pytestmark = pytest.mark.multiproc

CONFIG = REPO / "manifests" / "kind" / "cluster.yaml"
Config = dict[str, Any]


def shipped() -> Config:
    config: Config = yaml.safe_load(CONFIG.read_text())
    return config


def flag_value(args: list[str], flag: str) -> list[str]:
    """Every value of ``--flag=value`` and ``--flag value`` in a podman command line."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{flag}=")]
    return values + [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def test_the_shipped_config_is_accepted_and_reaches_the_nodes(kind: Path, tmp_path: Path) -> None:
    config = shipped()
    created = create_cluster(kind, CONFIG, tmp_path)
    runs = {r[r.index("--name") + 1]: r for r in created.runs()}
    name = config["name"]
    # kind got past loading and validation and planned one container per node of the file, named as the docs say
    assert sorted(runs) == [f"{name}-control-plane", f"{name}-worker", f"{name}-worker2"], created.output
    for node in config["nodes"]:
        digest = node["image"].split("@", 1)[1]
        assert all(r[-1].endswith(f"@{digest}") for r in runs.values())
    roles = {n: flag_value(r, "--label") for n, r in runs.items()}
    assert "io.x-k8s.kind.role=control-plane" in roles[f"{name}-control-plane"]
    mount = "{hostPath}:{containerPath}".format(**config["nodes"][1]["extraMounts"][0])
    for node, run in runs.items():
        # the dataset directory on both workers, not on the control plane
        assert (mount in flag_value(run, "--volume")) == node.endswith(("-worker", "-worker2")), (node, run)


def drop_control_plane(c: Config) -> None:
    c["nodes"] = [n for n in c["nodes"] if n["role"] != "control-plane"]


def misspell_extra_mounts(c: Config) -> None:
    c["nodes"][1]["extraMount"] = c["nodes"][1].pop("extraMounts")


def role_master(c: Config) -> None:
    c["nodes"][0]["role"] = "master"


def capital_name(c: Config) -> None:
    c["name"] = "MLBench"


@pytest.mark.parametrize(
    ("breaks", "says"),
    [
        (misspell_extra_mounts, "field extraMount not found in type v1alpha4.Node"),
        (role_master, '"master" is not a valid node role'),
        (drop_control_plane, "must have at least one control-plane node"),
        (capital_name, "'MLBench' is not a valid cluster name"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_a_broken_config_is_refused_before_any_node(
    kind: Path, tmp_path: Path, breaks: Callable[[Config], None], says: str
) -> None:
    config = shipped()
    breaks(config)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    created = create_cluster(kind, path, tmp_path / "work")
    assert created.returncode != 0
    assert says in created.output
    assert not created.runs()
    assert not [c for c in created.calls if c[:2] == ["inspect", "--type=image"]]
