#!/usr/bin/env python3
"""Write dist/install.yaml: the one-file install of a release (``make release VERSION=x.y.z IMAGE_REPO=...``).

The file is rendered from the kustomize bases (``kubectl kustomize``: manifests/default, i.e. the CRDs, the task
catalog and the operator, plus the admission policy of manifests/policy), never kept by hand. Its documents are
ordered so that one ``kubectl apply --server-side -f`` creates what each later document needs first: the CRDs,
the namespace, RBAC, the operator, the admission policy, then the catalog's tasks (custom resources of the CRDs
above). Both images are pointed at ``<IMAGE_REPO>/mlbench-{operator,runner}:<version>``: the operator's image, its
``MLBENCH_RUNNER_IMAGE`` and the policy's ``allowedImages`` (the runner's repository, as the operator's default).

The version must be pyproject.toml's (its one place) and CHANGELOG.md must have its entry.

Usage: hack/release.py --version X.Y.Z [--image-repo REGISTRY/TEAM] [--out dist/install.yaml] [--kubectl PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from mlbench_operator.policy import DEFAULT_IMAGE_REPO, repository_patterns

ROOT = Path(__file__).resolve().parents[1]
#: The kustomize bases of the install, rendered in this order (the documents are then sorted by KIND_RANK).
BASES = ("manifests/default", "manifests/policy")
Obj = dict[str, Any]
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

#: Where each kind goes: CRDs, the namespace, RBAC, the operator, the admission policy; custom resources last.
KIND_RANK = {
    "CustomResourceDefinition": 0,
    "Namespace": 1,
    "ServiceAccount": 2,
    "ClusterRole": 2,
    "ClusterRoleBinding": 2,
    "Role": 2,
    "RoleBinding": 2,
    "ConfigMap": 3,
    "Secret": 3,
    "Service": 3,
    "NetworkPolicy": 3,
    "Deployment": 3,
    "PodDisruptionBudget": 3,
    "ValidatingAdmissionPolicy": 4,
    "ValidatingAdmissionPolicyBinding": 5,
}
#: The rank of a custom resource (a kind one of the CRDs defines).
CUSTOM_RANK = 6
OPERATOR = "mlbench-operator"
RUNNER_ENV = "MLBENCH_RUNNER_IMAGE"


class ReleaseError(Exception):
    """What stops a release, said in words."""


def crd_kinds(docs: Iterable[Obj]) -> dict[tuple[str, str], str]:
    """(group, kind) -> the CRD's name, for every CRD among ``docs``."""
    return {
        (d["spec"]["group"], d["spec"]["names"]["kind"]): d["metadata"]["name"]
        for d in docs
        if d.get("kind") == "CustomResourceDefinition"
    }


def group_of(doc: Obj) -> str:
    api_version: str = doc.get("apiVersion", "")
    return api_version.rpartition("/")[0]


def rank(doc: Obj, custom: dict[tuple[str, str], str]) -> int:
    kind = doc.get("kind", "")
    if (group_of(doc), kind) in custom:
        return CUSTOM_RANK
    if kind not in KIND_RANK:
        name = doc.get("metadata", {}).get("name")
        raise ReleaseError(f"{kind} {name!r}: no place in the install order (add its kind to KIND_RANK)")
    return KIND_RANK[kind]


def order(docs: Sequence[Obj]) -> list[Obj]:
    """``docs`` sorted by KIND_RANK (stable: within a rank, as rendered)."""
    custom = crd_kinds(docs)
    return sorted(docs, key=lambda d: rank(d, custom))


def misplaced_uses(docs: Sequence[Obj]) -> list[str]:
    """Custom resources that come before their CRD (or have none among ``docs``), one line each."""
    custom = crd_kinds(docs)
    seen: set[tuple[str, str]] = set()
    problems = []
    for i, doc in enumerate(docs):
        key = (group_of(doc), doc.get("kind", ""))
        if doc.get("kind") == "CustomResourceDefinition":
            seen.add((doc["spec"]["group"], doc["spec"]["names"]["kind"]))
        elif key[0].endswith("mlbench.io") and key not in seen:
            where = "before its CRD" if key in custom else "without a CRD in the file"
            problems.append(f"document {i} ({key[1]} {doc['metadata'].get('name')!r}) comes {where}")
    return problems


def retarget(docs: Sequence[Obj], image_repo: str, version: str) -> list[Obj]:
    """Both images at ``<image_repo>/mlbench-{operator,runner}:<version>``: the operator's container image, its
    MLBENCH_RUNNER_IMAGE and the admission policy's allowedImages (the runner's repository, any tag or digest)."""
    repo = image_repo.rstrip("/") or DEFAULT_IMAGE_REPO
    runner = f"{repo}/mlbench-runner:{version}"
    found = {"operator": False, "runner": False, "policy": False}
    for doc in docs:
        if doc.get("kind") == "Deployment" and doc["metadata"]["name"] == OPERATOR:
            for container in doc["spec"]["template"]["spec"]["containers"]:
                container["image"] = f"{repo}/mlbench-operator:{version}"
                found["operator"] = True
                for env in container.get("env", []):
                    if env["name"] == RUNNER_ENV:
                        env["value"] = runner
                        found["runner"] = True
        if doc.get("kind") == "ValidatingAdmissionPolicy":
            for variable in doc["spec"].get("variables", []):
                if variable["name"] == "allowedImages":
                    variable["expression"] = repr(list(repository_patterns(runner)))
                    found["policy"] = True
    missing = [what for what, ok in found.items() if not ok]
    if missing:
        raise ReleaseError(f"the rendered manifests lack what names the images: {', '.join(missing)}")
    return list(docs)


def project_version(root: Path = ROOT) -> str:
    version: str = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    return version


def check_version(version: str, project: str, changelog: str) -> None:
    """The release's version is pyproject.toml's and CHANGELOG.md has a ``## [x.y.z]`` (or ``## x.y.z``) entry."""
    if not re.fullmatch(r"\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?", version):
        raise ReleaseError(f"VERSION {version!r} is not x.y.z")
    if version != project:
        raise ReleaseError(f"VERSION {version} is not pyproject.toml's version {project}: bump it there first")
    if not re.search(rf"(?m)^## \[?{re.escape(version)}\]?(\s|$)", changelog):
        raise ReleaseError(f"CHANGELOG.md has no entry for {version} (a heading '## [{version}] - <date>')")


def render(kubectl: str, base: str) -> list[Obj]:
    res = subprocess.run([kubectl, "kustomize", str(ROOT / base)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ReleaseError(f"{kubectl} kustomize {base} failed: {res.stderr.strip()}")
    return [d for d in yaml.load_all(res.stdout, Loader=LOADER) if d]


def install_yaml(docs: Sequence[Obj]) -> str:
    header = "# MLBench install: kubectl apply --server-side -f install.yaml (README.md, 'On a cluster')\n"
    return header + yaml.dump_all(docs, Dumper=DUMPER, sort_keys=False, explicit_start=True)


def release(version: str, image_repo: str, kubectl: str) -> str:
    changelog = ROOT / "CHANGELOG.md"
    check_version(version, project_version(), changelog.read_text() if changelog.exists() else "")
    docs = order(retarget([d for base in BASES for d in render(kubectl, base)], image_repo, version))
    problems = misplaced_uses(docs)
    if problems:
        raise ReleaseError("; ".join(problems))
    return install_yaml(docs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", required=True)
    parser.add_argument("--image-repo", default="")
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "install.yaml")
    parser.add_argument("--kubectl", default=os.environ.get("MLBENCH_KUBECTL") or shutil.which("kubectl") or "kubectl")
    args = parser.parse_args(argv)
    try:
        text = release(args.version, args.image_repo, args.kubectl)
    except ReleaseError as err:
        print(f"release: {err}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"release: wrote {args.out} ({text.count(chr(10) + '---')} documents)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
