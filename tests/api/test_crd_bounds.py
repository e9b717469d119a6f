"""Every string a tenant can set in the generated CRDs has a length bound, every array and map a size bound
(issue 33: a shared operator must not be handed megabyte strings to copy into every pod, log line and status
write). Read from crds/bases (``mlbench crds --check`` keeps them equal to the models); a field that cannot be
bounded is exempted below, by path, with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

BASES = Path(__file__).resolve().parents[2] / "crds" / "bases"

#: Paths (kind, then JSON path; ``[]`` an array's items, ``{}`` a map's values) left unbounded, and why.
EXEMPT = {
    "BenchmarkRun.apiVersion": "the API server sets and checks it",
    "BenchmarkRun.kind": "the API server sets and checks it",
    "BenchmarkSweep.apiVersion": "the API server sets and checks it",
    "BenchmarkSweep.kind": "the API server sets and checks it",
    "BenchmarkTask.apiVersion": "the API server sets and checks it",
    "BenchmarkTask.kind": "the API server sets and checks it",
    # free-form core/v1 VolumeSources: their fields are the pod's, which the API server bounds when the pod is
    # created; the object as a whole is bounded by the API server's request size
    "BenchmarkTask.spec.dataset.volume": "a core/v1 VolumeSource, validated with the pods it goes into",
    "BenchmarkRun.status.taskSnapshot.dataset.volume": "the operator's copy of the task's (status: no tenant writes)",
    # a run's core/v1 Affinity and TopologySpreadConstraints (spec.pod): validated with the worker pods they go into
    "BenchmarkRun.spec.pod.affinity": "a core/v1 Affinity, validated with the worker pods it goes into",
    "BenchmarkRun.spec.pod.topologySpreadConstraints[]": "a core/v1 TopologySpreadConstraint, validated with the pods",
    "BenchmarkSweep.spec.template.pod.affinity": "a run's spec.pod.affinity (the sweep's runs copy it)",
    "BenchmarkSweep.spec.template.pod.topologySpreadConstraints[]": "a run's spec.pod.topologySpreadConstraints",
    "BenchmarkTask.spec.pod.affinity": "a run's spec.pod.affinity (merged under the run's)",
    "BenchmarkTask.spec.pod.topologySpreadConstraints[]": "a run's spec.pod.topologySpreadConstraints",
    "BenchmarkRun.status.taskSnapshot.pod.affinity": "the task's pod.affinity, copied at admission",
    "BenchmarkRun.status.taskSnapshot.pod.topologySpreadConstraints[]": "the task's, copied at admission",
}
#: ``format: date-time`` strings are parsed by the API server (RFC 3339), which bounds them.
DATE_TIME = "date-time"


def _crds() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(BASES.glob("mlbench.io_*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for version in doc["spec"]["versions"]:
            yield doc["spec"]["names"]["kind"], version["schema"]["openAPIV3Schema"]


def unbounded(schema: dict[str, Any], path: str) -> Iterator[str]:
    """Paths under ``schema`` without a bound: strings (maxLength, an enum, or a date-time), arrays (maxItems),
    maps (maxProperties), free-form objects (none possible)."""
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):  # the string branch's bounds sit on the node (crdgen)
        if "maxLength" not in schema:
            yield path
        return
    if kind == "string" and not ("maxLength" in schema or "enum" in schema or schema.get("format") == DATE_TIME):
        yield path
    if kind == "array":
        if "maxItems" not in schema:
            yield path
        yield from unbounded(schema.get("items") or {}, f"{path}[]")
    values = schema.get("additionalProperties")
    if isinstance(values, dict):
        if "maxProperties" not in schema:
            yield path
        yield from unbounded(values, f"{path}{{}}")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        yield path
    for name, sub in (schema.get("properties") or {}).items():
        yield from unbounded(sub, f"{path}.{name}")
    for combinator in ("anyOf", "oneOf", "allOf"):  # a branch's own bounds, or its node's (as the API server reads)
        for branch in schema.get(combinator) or []:
            yield from unbounded({**_bounds(schema), **branch}, path)


def _bounds(schema: dict[str, Any]) -> dict[str, Any]:
    """The size bounds (and the enum or format) that a node holds for each of its anyOf/oneOf/allOf branches."""
    return {k: v for k, v in schema.items() if k in {"maxLength", "maxItems", "maxProperties", "enum", "format"}}


def test_every_string_array_and_map_a_tenant_sets_is_bounded() -> None:
    found = {p for kind, schema in _crds() for p in unbounded(schema, kind)}
    assert found - set(EXEMPT) == set(), "add a bound (pydantic max_length), or an exemption with its reason"
    assert set(EXEMPT) - found == set(), "an exemption no longer needed"


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, ["x"]),
        ({"type": "string", "maxLength": 3}, []),
        ({"type": "string", "enum": ["a"]}, []),
        ({"type": "string", "format": "date-time"}, []),
        ({"type": "string", "pattern": "^[a-f]{64}$"}, ["x"]),  # a pattern is no bound for the API server
        ({"type": "array", "items": {"type": "string", "maxLength": 1}}, ["x"]),
        ({"type": "array", "maxItems": 2, "items": {"type": "string"}}, ["x[]"]),
        ({"type": "object", "additionalProperties": {"type": "string", "maxLength": 1}}, ["x"]),
        ({"type": "object", "maxProperties": 2, "additionalProperties": {"type": "string"}}, ["x{}"]),
        ({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}, ["x"]),
        ({"x-kubernetes-int-or-string": True, "maxLength": 9, "anyOf": [{"type": "string"}]}, []),
        ({"type": "object", "x-kubernetes-preserve-unknown-fields": True}, ["x"]),
        ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}}}, ["x.a"]),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, ["x"]),
        ({"maxLength": 5, "anyOf": [{"type": "integer"}, {"type": "string"}]}, []),
        ({"oneOf": [{"type": "array", "items": {"type": "integer"}}]}, ["x"]),
        ({"allOf": [{"properties": {"a": {"type": "string"}}}]}, ["x.a"]),
        (
            {
                "type": "object",
                "properties": {"p": {"type": "object", "properties": {"s": {"enum": ["A"], "type": "string"}}}},
            },
            [],
        ),
        (
            {"type": "array", "maxItems": 1, "items": {"type": "object", "additionalProperties": {"type": "integer"}}},
            ["x[]"],
        ),
    ],
)
def test_the_walk_finds_what_is_unbounded(schema: dict[str, Any], expected: list[str]) -> None:
    assert list(unbounded(schema, "x")) == expected
