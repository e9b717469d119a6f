"""Loading the shared valid/invalid API examples (also used by the server-side tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CATALOG = Path(__file__).resolve().parents[2] / "manifests" / "catalog"
EXPECT_FIELD = "test.mlbench.io/expect-field"


def _load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), path
    return doc


def valid_examples() -> list[tuple[str, dict[str, Any]]]:
    """Every object that must be accepted: the valid examples and the whole catalog."""
    paths = sorted((EXAMPLES / "valid").glob("*.yaml"))
    paths += sorted(p for p in CATALOG.glob("*.yaml") if p.name != "kustomization.yaml")
    return [(p.name, _load(p)) for p in paths]


def invalid_examples() -> list[tuple[str, dict[str, Any], str]]:
    """Objects that must be rejected, with the field their error must name."""
    out = []
    for path in sorted((EXAMPLES / "invalid").glob("*.yaml")):
        doc = _load(path)
        out.append((path.name, doc, doc["metadata"]["annotations"][EXPECT_FIELD]))
    return out
