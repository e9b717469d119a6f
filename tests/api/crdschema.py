"""Walking the committed CRDs' schemas (shared by the description tests, local and on a cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mlbench_api.crdgen import CrdSpec

BASES = Path(__file__).resolve().parents[2] / "crds" / "bases"


def committed_schema(kind: CrdSpec) -> dict[str, Any]:
    """The openAPIV3Schema of ``kind`` as checked in under ``crds/bases``."""
    doc = yaml.safe_load((BASES / kind.filename).read_text())
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


def properties(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every property under ``node`` as (path, schema), through objects, arrays (``[]``) and maps (``{}``)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name, child in (node.get("properties") or {}).items():
        out.append((f"{path}.{name}", child))
        out += properties(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        out += properties(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += properties(node["additionalProperties"], f"{path}{{}}")
    return out


def undescribed(schema: dict[str, Any], root: str) -> list[str]:
    """Paths of the properties that have no (or a blank) description.

    The root's ``metadata`` is exempt: a CRD may say nothing there but name constraints (the API
    server refuses even a description) and the server publishes ObjectMeta's description for it.
    """
    return [
        path
        for path, node in properties(schema, root)
        if path != f"{root}.metadata" and not str(node.get("description", "")).strip()
    ]
