"""Loading the shared valid/invalid API examples (also used by the server-side tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CATALOG = Path(__file__).resolve().parents[2] / "manifests" / "catalog"
EXPECT_FIELD = "test.mlbench.io/expect-field"
#: On a valid example: the API server accepts it, but the operator's admission refuses the run (unknown
#: task, a closed-division override, an invalid effective configuration), and so does ``mlbench validate``
#: (not with ``--schema-only``); the value is the field its message names.
ADMISSION_REFUSES = "test.mlbench.io/admission-refuses"


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


def admission_refused(doc: dict[str, Any]) -> str | None:
    """The field the admission's refusal names, for an example the API server accepts but the operator
    refuses; None for one both accept."""
    value = ((doc.get("metadata") or {}).get("annotations") or {}).get(ADMISSION_REFUSES)
    return str(value) if value else None


def example_files() -> list[Path]:
    """Every example file, valid and invalid."""
    return sorted((EXAMPLES / "valid").glob("*.yaml")) + sorted((EXAMPLES / "invalid").glob("*.yaml"))
