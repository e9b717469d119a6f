"""Generate the CRD YAML from the pydantic models.

Pydantic emits JSON Schema (draft 2020-12, with ``$ref`` and ``anyOf``-null for
optionals); Kubernetes wants a *structural* OpenAPI v3.0 schema: every node typed, no
``$ref``, no ``additionalProperties: false``, ``exclusiveMinimum`` as a boolean. This
module does exactly that translation and adds what only a CRD has (scope, names,
printer columns, the status subresource, root-level CEL rules).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from mlbench_api.common import GROUP, MAX_LABEL_VALUE, VERSION, cel
from mlbench_api.run import FORBIDDEN, MAX_RUN_NAME, SUSPEND_FINISHED, SUSPEND_FINISHED_RULE, BenchmarkRunSpec
from mlbench_api.runstatus import BenchmarkRunStatus
from mlbench_api.sweep import BenchmarkSweepSpec, BenchmarkSweepStatus
from mlbench_api.task import BenchmarkTaskSpec

Schema = dict[str, Any]

_DROP = {"title", "examples"}


def _inline(node: Any, defs: dict[str, Schema]) -> Any:
    """Resolve ``$ref`` and collapse optionals, recursively."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        target.update(node)  # local description/default win over the definition's
        node = target
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        node = {**_inline(inner, defs), **node}
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            del node["anyOf"]
            node = {**_inline(options[0], defs), **node}
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "default" and value is None:
            continue
        if key == "description" and isinstance(value, str):
            out[key] = " ".join(value.replace("``", "`").split())
        elif key == "properties":
            out[key] = {name: _inline(prop, defs) for name, prop in value.items()}
        else:
            out[key] = _inline(value, defs)
    return out


def _structural(node: Any) -> Any:
    """Rewrite JSON-Schema-isms into the OpenAPI v3.0 subset the API server accepts."""
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {k: _structural(v) for k, v in node.items()}
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "enum" in node and "type" not in node:
        sample = node["enum"][0]
        node["type"] = "integer" if isinstance(sample, int) else "string"
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node.get(bound), bool):
            node[bound.replace("exclusiveM", "m")] = node[bound]
            node[bound] = True
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if node.get("x-kubernetes-int-or-string"):
        # a structural schema allows only the bare types under anyOf: the branches' own checks move up, where
        # the server applies each to the values it fits (pattern to a string, minimum to a number)
        branches = node.get("anyOf", [])
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        for check in ("pattern", "maxLength", "minimum"):
            value = next((o[check] for o in branches if check in o), None)
            if value is not None:
                node[check] = value
    if "properties" in node and "type" not in node:
        node["type"] = "object"
    return node


def openapi_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI schema of one pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(_inline(raw, raw.get("$defs", {})))


@dataclass
class CrdSpec:
    """Everything about one kind that is not in its pydantic model."""

    kind: str
    plural: str
    short_names: list[str]
    scope: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel] | None = None
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    root_rules: list[dict[str, str]] = field(default_factory=list)
    selectable_fields: list[str] = field(default_factory=list)
    description: str = ""

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def filename(self) -> str:
        return f"{GROUP}_{self.plural}.yaml"


#: The standard texts of apiVersion and kind (as in controller-gen's CRDs).
API_VERSION_DESCRIPTION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should convert "
    "recognized schemas to the latest internal value, and may reject unrecognized values. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"
)
KIND_DESCRIPTION = (
    "Kind is a string value representing the REST resource this object represents. Servers may infer this from "
    "the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
)


def crd(spec: CrdSpec) -> dict[str, Any]:
    """The CustomResourceDefinition object for one kind."""
    properties: Schema = {
        "apiVersion": {"type": "string", "description": API_VERSION_DESCRIPTION},
        "kind": {"type": "string", "description": KIND_DESCRIPTION},
        # The API server refuses anything but name/generateName constraints under metadata (a description
        # included) and publishes ObjectMeta's own description there.
        "metadata": {"type": "object"},
        "spec": openapi_schema(spec.spec_model),
    }
    if spec.status_model is not None:
        properties["status"] = openapi_schema(spec.status_model)
    root: Schema = {
        "type": "object",
        "description": spec.description,
        "required": ["spec"],
        "properties": properties,
    }
    if spec.root_rules:
        root["x-kubernetes-validations"] = spec.root_rules
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": root},
        "additionalPrinterColumns": spec.printer_columns,
    }
    if spec.status_model is not None:
        version["subresources"] = {"status": {}}
    if spec.selectable_fields:
        version["selectableFields"] = [{"jsonPath": p} for p in spec.selectable_fields]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": spec.name},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": spec.kind,
                "listKind": f"{spec.kind}List",
                "plural": spec.plural,
                "singular": spec.kind.lower(),
                "shortNames": spec.short_names,
                "categories": ["mlbench"],
            },
            "scope": spec.scope,
            "versions": [version],
        },
    }


def _col(name: str, path: str, type_: str = "string", priority: int = 0, description: str = "") -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        column["priority"] = priority
    if description:
        column["description"] = description
    return column


AGE = _col("Age", ".metadata.creationTimestamp", "date")

KINDS: list[CrdSpec] = [
    CrdSpec(
        kind="BenchmarkTask",
        plural="benchmarktasks",
        short_names=["bt"],
        scope="Cluster",
        spec_model=BenchmarkTaskSpec,
        description="BenchmarkTask is what to train, with which hyperparameters, to which goal.",
        root_rules=[
            cel(
                f"size(self.metadata.name) <= {MAX_LABEL_VALUE}",
                f"metadata.name must be at most {MAX_LABEL_VALUE} characters as runs label their pods with it "
                "(mlbench.io/task)",
                reason="FieldValueInvalid",
            ),
        ],
        printer_columns=[
            _col("Division", ".spec.division"),
            _col("Model", ".spec.model.name"),
            _col("Depth", ".spec.model.depth", "integer", priority=1),
            _col("Dataset", ".spec.dataset.name"),
            _col("Metric", ".spec.goal.metric"),
            _col("Target", ".spec.goal.target", "number", description="Goal target, in the goal metric's units"),
            _col("Epochs", ".spec.training.maxEpochs", "integer", priority=1),
            AGE,
        ],
    ),
    CrdSpec(
        kind="BenchmarkRun",
        plural="benchmarkruns",
        short_names=["br"],
        scope="Namespaced",
        spec_model=BenchmarkRunSpec,
        status_model=BenchmarkRunStatus,
        description="BenchmarkRun is one execution of a BenchmarkTask on a set of workers.",
        root_rules=[
            cel(
                f"size(self.metadata.name) <= {MAX_RUN_NAME}",
                f"metadata.name must be at most {MAX_RUN_NAME} characters so that "
                "<run>-worker-<N> pod names stay valid DNS labels",
                reason="FieldValueInvalid",
            ),
            cel(
                "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                "metadata.name must be a DNS-1035 label (start with a letter) as it names the run's Service",
                reason="FieldValueInvalid",
            ),
            cel(SUSPEND_FINISHED_RULE, SUSPEND_FINISHED, ".spec.suspend", FORBIDDEN),
        ],
        selectable_fields=[".spec.taskRef.name"],
        printer_columns=[
            _col("Task", ".spec.taskRef.name"),
            _col("Workers", ".spec.workers", "integer"),
            _col("Backend", ".spec.backend"),
            _col("Algorithm", ".spec.algorithm", priority=1),
            _col("Phase", ".status.phase"),
            _col(
                "Epoch",
                ".status.progress.epochRounded",
                description="Epochs done, cut to tenths (exact: status.progress.epoch)",
            ),
            _col(
                "Score",
                ".status.progress.score",
                description="Latest evaluation of the task's goal metric: 81.2% (accuracy), 24.3 BLEU, ppl 71.2, "
                "loss 0.412 (exact: status.progress.lastScore)",
            ),
            _col(
                "Time-To-Goal",
                ".status.result.timeToGoal",
                description="A duration (exact seconds: status.result.timeToGoalSeconds)",
            ),
            _col(
                "Compression",
                ".status.result.compression",
                priority=1,
                description="Bytes per step of allreduce-sgd / of this run's algorithm, one decimal "
                "(exact: status.result.compressionRatio)",
            ),
            _col("Restarts", ".status.restarts", "integer", priority=1),
            _col("Ready", ".status.workers.ready", "integer", priority=1),
            AGE,
        ],
    ),
    CrdSpec(
        kind="BenchmarkSweep",
        plural="benchmarksweeps",
        short_names=["bsw"],
        scope="Namespaced",
        spec_model=BenchmarkSweepSpec,
        status_model=BenchmarkSweepStatus,
        description="BenchmarkSweep is a study: a run template and a matrix, expanded into BenchmarkRuns.",
        root_rules=[
            cel(
                f"size(self.metadata.name) <= {MAX_RUN_NAME}",
                f"metadata.name must be at most {MAX_RUN_NAME} characters as it starts the names of its runs",
                reason="FieldValueInvalid",
            ),
            cel(
                "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                "metadata.name must be a DNS-1035 label (start with a letter) as it starts the names of its runs",
                reason="FieldValueInvalid",
            ),
        ],
        printer_columns=[
            _col("Total", ".status.total", "integer", description="Runs the matrix expands to"),
            _col("Pending", ".status.pending", "integer", priority=1, description="Runs not created yet"),
            _col("Running", ".status.running", "integer", description="Runs created and not finished"),
            _col("Succeeded", ".status.succeeded", "integer"),
            _col("Failed", ".status.failed", "integer"),
            _col("Ready", ".status.conditions[?(@.type=='Ready')].status", priority=1),
            AGE,
        ],
    ),
]

HEADER = "# Generated by `mlbench crds` from crds/mlbench_api; do not edit.\n"


def render(spec: CrdSpec) -> str:
    return HEADER + yaml.safe_dump(crd(spec), sort_keys=False, width=120)


def write_all(directory: Path) -> list[Path]:
    """(Re)write every CRD file plus the kustomization that lists them."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in KINDS:
        path = directory / spec.filename
        path.write_text(render(spec))
        written.append(path)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [spec.filename for spec in KINDS],
    }
    path = directory / "kustomization.yaml"
    path.write_text(HEADER + yaml.safe_dump(kustomization, sort_keys=False))
    written.append(path)
    return written


def stale(directory: Path) -> list[str]:
    """Files under ``directory`` that differ from what the models generate."""
    out = []
    for spec in KINDS:
        path = directory / spec.filename
        if not path.exists() or path.read_text() != render(spec):
            out.append(str(path))
    return out
