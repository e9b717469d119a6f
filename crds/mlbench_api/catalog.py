"""The official task catalog, loadable with or without a cluster.

The catalog is plain ``BenchmarkTask`` YAML under ``manifests/catalog`` (also applied to
clusters with kustomize), so the local runner and the operator read the same numbers.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from mlbench_api.common import GROUP, KINDS
from mlbench_api.errors import InvalidObject, format_errors
from mlbench_api.run import BenchmarkRun
from mlbench_api.task import BenchmarkTask

CATALOG_ENV = "MLBENCH_CATALOG"
_CANDIDATES = (
    Path(__file__).resolve().parents[2] / "manifests" / "catalog",  # a source checkout
    Path("/etc/mlbench/catalog"),  # the runner image
    Path(sys.prefix) / "share" / "mlbench-k8s" / "catalog",  # `pip install mlbench-k8s` (pyproject's data-files)
)


def catalog_dir() -> Path:
    """Where the catalog lives: ``$MLBENCH_CATALOG``, the checkout, the image, or the installed distribution."""
    env = os.environ.get(CATALOG_ENV)
    if env:
        if not Path(env).is_dir():  # a mistyped path would read as an empty catalog: "known: none"
            raise FileNotFoundError(f"${CATALOG_ENV}: {env} is not a directory")
        return Path(env)
    for candidate in _CANDIDATES:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no task catalog found; set {CATALOG_ENV} to a directory of BenchmarkTask YAML")


#: The fields of ``metav1.ObjectMeta``: the API server refuses any other under ``metadata``
#: (strict field validation, kubectl's default), while the models let them pass through.
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
#: Go's encoding/json writes a whole float64 below this without a fraction or exponent (``4.0`` as ``4``).
_GO_PLAIN_FLOAT_LIMIT = 1e21

M = TypeVar("M", bound=BaseModel)


class NotJson(ValueError):
    """A YAML value that JSON (and so the API server) cannot carry, e.g. ``.nan``."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


def wire(value: Any, path: str = "") -> Any:
    """``value`` as the API server receives it from ``kubectl apply``: YAML turned into JSON.

    kubectl converts YAML to JSON before sending it, so a whole float such as ``4.0`` arrives as
    ``4`` (Go writes whole floats without a fraction), a YAML timestamp as a string, and every key
    as a string; NaN and infinities are not JSON at all. Mappings drop their null values, as the
    API server does for ``kubectl apply`` and create (no field of ours is nullable), so
    ``workers: null`` is as if unset; server-side apply is stricter (see :func:`null_fields`).
    """
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            name = _wire_key(key)
            if item is not None:
                out[name] = wire(item, f"{path}.{name}" if path else name)
        return out
    if isinstance(value, list):
        return [wire(item, f"{path}.{i}" if path else str(i)) for i, item in enumerate(value)]
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJson(path, f"{value!r} is not a JSON number (NaN and infinities cannot be sent)")
        return int(value) if value.is_integer() and abs(value) < _GO_PLAIN_FLOAT_LIMIT else value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


def null_fields(value: Any, path: str = "") -> list[str]:
    """The paths of the null values in mappings, which :func:`wire` drops.

    ``kubectl apply`` and create drop them (the API server prunes them), but server-side apply
    (``kubectl apply --server-side``, Flux) refuses a null unless the field has a default.
    """
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{_wire_key(key)}" if path else _wire_key(key)
            found += [name] if item is None else null_fields(item, name)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += null_fields(item, f"{path}.{i}" if path else str(i))
    return found


def _wire_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool) or key is None:
        return json.dumps(key)
    converted = wire(key)
    return converted if isinstance(converted, str) else json.dumps(converted)


def strict_validate(model: type[M], doc: Any, source: str = "<input>") -> M:
    """Validate ``doc`` (read from YAML or JSON) the way the API server would.

    Strictly typed, as the CRD's OpenAPI schema is: ``workers: "4"`` or ``nesterov: "true"`` are
    refused (pydantic's default lax mode would convert them), an integer field takes no fraction,
    a number field takes an integer. The document goes through :func:`wire` and then pydantic's
    strict JSON mode, in which an enum field still takes its string value. For a whole object,
    ``metadata`` may hold only the fields of ObjectMeta.
    """
    try:
        text = json.dumps(wire(doc), allow_nan=False)
    except NotJson as exc:
        raise InvalidObject(source, [str(exc)]) from exc
    problems: list[str] = []
    try:
        obj = model.model_validate_json(text, strict=True)
    except ValidationError as exc:
        problems = format_errors(exc)
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    if isinstance(meta, dict) and model in (BenchmarkRun, BenchmarkTask):
        problems += [
            f"metadata.{name}: Extra inputs are not permitted (not a field of ObjectMeta)"
            for name in map(_wire_key, meta)
            if name not in OBJECT_META_FIELDS
        ]
    if problems:
        raise InvalidObject(source, problems)
    return obj


def parse_task(doc: dict[str, Any], source: str = "<input>") -> BenchmarkTask:
    """A BenchmarkTask document (YAML/JSON), checked as strictly as the API server does."""
    return strict_validate(BenchmarkTask, doc, source)


def parse_run(doc: dict[str, Any], source: str = "<input>") -> BenchmarkRun:
    """A BenchmarkRun document (YAML/JSON), checked as strictly as the API server does."""
    return strict_validate(BenchmarkRun, doc, source)


def load_documents(path: Path) -> list[dict[str, Any]]:
    """All YAML documents in a file, skipping empty ones; broken YAML or a document that is not a
    mapping raises :class:`InvalidObject` naming the file, line and column."""
    documents, error = read_documents(path)
    if error is not None:
        raise error
    out = []
    for doc in documents:
        if doc.empty:
            continue
        if not isinstance(doc.data, dict):
            raise InvalidObject(doc.where(), [doc.not_a_mapping()])
        out.append(doc.data)
    return out


@dataclass(frozen=True)
class Document:
    """One YAML document of a file, with its node tree so a field can be traced to its line."""

    source: str
    #: 1-based position in the file, empty documents counted (what ``---`` separates)
    index: int
    data: Any
    node: yaml.Node
    #: why kubectl refuses this document as it stands (a list's item it will not apply), else ""
    refused: str = ""

    @property
    def empty(self) -> bool:
        return self.data is None

    @property
    def kind(self) -> Any:
        return self.data.get("kind") if isinstance(self.data, dict) else None

    @property
    def name(self) -> Any:
        meta = self.data.get("metadata") if isinstance(self.data, dict) else None
        return meta.get("name") if isinstance(meta, dict) else None

    def label(self) -> str:
        """``BenchmarkRun my-run`` (or what is known of it)."""
        return " ".join(str(part) for part in (self.kind or "object", self.name) if part is not None)

    def not_a_mapping(self) -> str:
        return f"expected a Kubernetes object (a mapping), got {_yaml_type(self.data)}"

    def locate(self, field: str = "") -> tuple[int, int]:
        """1-based line and column of ``field`` (``spec.workers``), or of its deepest parent present."""
        node = self.node
        parts = [p for p in field.split(".") if p] if field else []
        while parts:
            child, used = _child(node, parts)
            if child is None:
                break
            node, parts = child, parts[used:]
        return node.start_mark.line + 1, node.start_mark.column + 1

    def warnings(self) -> list[str]:
        """``file:line:column: ...`` lines about what the API server accepts but is likely a mistake."""
        return [
            f"{self.source}:{mark.line + 1}:{mark.column + 1}: warning: duplicate key {key!r}: "
            "only its last value counts (as with kubectl)"
            for key, mark in duplicate_keys(self.node)
        ]

    def where(self, field: str = "") -> str:
        line, column = self.locate(field)
        return f"{self.source}:{line}:{column}"

    def unlisted(self) -> list[Document]:
        """The objects kubectl applies for this document, one by one, each traced to its own lines: the
        items of a ``v1 List`` or of an MLBench ``<Kind>List``, else the document itself.

        As kubectl 1.34 does (each rule checked against it): a list's ``items`` must be a list (missing,
        null or a mapping: refused); a null item is refused; a list is not flattened twice (a list inside
        a list is refused); an item of a ``<Kind>List`` with neither ``apiVersion`` nor ``kind`` takes the
        list's, and is checked as a ``<Kind>`` whatever it says. Another API group's lists are that group's
        objects (not checked). A refused item comes back with ``refused`` set."""
        data = self.data
        plain = isinstance(data, dict) and data.get("apiVersion") == "v1" and self.kind == "List"
        typed = self.typed_list_of()
        if not plain and typed is None:
            return [self]
        items = data.get("items")
        if "items" not in data:
            return [self.refuse("items: Field required (a list's objects)")]
        if not isinstance(items, list):
            return [self.refuse(f"items: expected a list of objects, got {_yaml_type(items)}")]
        nodes, _ = _child(self.node, ["items"])
        item_nodes = nodes.value if isinstance(nodes, yaml.SequenceNode) else []
        if len(item_nodes) != len(items):
            item_nodes = [self.node] * len(items)
        children = []
        for i, (item, node) in enumerate(zip(items, item_nodes, strict=True)):
            child = Document(self.source, self.index, _inherit(item, data, typed), node)
            problem = child.not_a_mapping() if not isinstance(item, dict) else _misplaced(child.kind, typed)
            # "list item N" (not "items.N", a field path the printer would look up inside the item itself)
            children.append(child.refuse(f"list item {i}: {problem}") if problem else child)
        return children

    def typed_list_of(self) -> str | None:
        """``BenchmarkRun`` for an MLBench ``BenchmarkRunList`` (and so on); else None."""
        api_version = self.data.get("apiVersion") if isinstance(self.data, dict) else None
        if not (isinstance(api_version, str) and api_version.split("/")[0] == GROUP and isinstance(self.kind, str)):
            return None
        kind = self.kind.removesuffix("List")
        return kind if kind != self.kind and kind in KINDS else None

    def refuse(self, problem: str) -> Document:
        return dataclasses.replace(self, refused=problem)


def _misplaced(kind: Any, typed: str | None) -> str:
    """Why an item of a ``<typed>List`` (or of a ``v1 List``: ``typed`` None) cannot be in it, else ""."""
    if typed is not None and kind != typed:
        return f"kind: expected {typed} (an item of a {typed}List), got {kind!r}"
    if typed is None and isinstance(kind, str) and kind.endswith("List"):
        return f"kind: a {kind} inside a List (kubectl does not apply a list inside a list)"
    return ""


def _inherit(item: Any, listed: dict[str, Any], typed: str | None) -> Any:
    """A typed list's item with neither ``apiVersion`` nor ``kind`` takes them from the list, as kubectl's
    list decoder does (the API server's own lists leave them out)."""
    if typed is None or not isinstance(item, dict) or item.get("apiVersion") or item.get("kind"):
        return item
    return {"apiVersion": listed["apiVersion"], "kind": typed, **item}


def _child(node: yaml.Node, parts: list[str]) -> tuple[yaml.Node | None, int]:
    """The child of ``node`` that the leading ``parts`` name, and how many parts that took; a key may
    itself contain dots (a label such as ``mlbench.io/task-id``), so the longest match wins."""
    if isinstance(node, yaml.MappingNode):
        for used in range(len(parts), 0, -1):
            key = ".".join(parts[:used])
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                    return value_node, used
    elif isinstance(node, yaml.SequenceNode) and parts[0].isdigit() and int(parts[0]) < len(node.value):
        return node.value[int(parts[0])], 1
    return None, 0


#: What a YAML value is called in a message, by its Python type (bool before int: a bool is an int too).
_YAML_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (list, "a list"),
    (str, "a string"),
    (bool, "a boolean"),
    ((int, float), "a number"),
    (type(None), "null"),
    (dict, "a mapping"),
)


def _yaml_type(value: Any) -> str:
    return next((name for kind, name in _YAML_TYPES if isinstance(value, kind)), type(value).__name__)


_INT, _FLOAT, _BOOL = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class KubectlLoader(yaml.SafeLoader):
    """YAML read as ``kubectl apply -f`` reads it (go-yaml v2), not as PyYAML's YAML 1.1 does.

    The differences that change a verdict: ``y``/``n`` are booleans; ``1e3`` (no dot) and ``5.``
    are floats and ``0o17`` is an octal integer; ``1:20`` (sexagesimal) is a string, as is an
    unquoted timestamp. The same text thus reaches the models with the types the API server sees.
    """

    bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}

    def construct_go_int(self, node: yaml.ScalarNode) -> int:
        """What Go's ``strconv.ParseInt(s, 0, 64)`` makes of the text, underscores dropped."""
        text = str(self.construct_scalar(node)).replace("_", "")
        digits = text.lstrip("+-")
        if len(digits) > 1 and digits[0] == "0" and digits.isdigit():
            return int(text, 8)  # a leading 0: octal
        return int(text, 0)


KubectlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT, _TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
KubectlLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
KubectlLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^[-+]?(?:0[bB][01_]+|0[oO][0-7_]+|0[xX][0-9a-fA-F_]+|0[0-7_]*|[1-9][0-9_]*)$"),
    list("-+0123456789"),
)
KubectlLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
KubectlLoader.add_constructor(_INT, KubectlLoader.construct_go_int)


def read_documents(path: Path) -> tuple[list[Document], InvalidObject | None]:
    """Every document of a YAML file, empty ones included, and the syntax error that ended the
    file early (``file:line:column`` and which document), if any: the documents before it are
    still returned so they can be checked."""
    source = str(path)
    documents: list[Document] = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return documents, InvalidObject(source, [f"cannot read the file: {exc}"])
    loader = KubectlLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # check_node said there is one
                break
            data = loader.construct_document(node)
            documents.append(Document(source, len(documents) + 1, data, node))
    except yaml.MarkedYAMLError as exc:
        return documents, _syntax_error(source, exc, len(documents) + 1, text)
    except yaml.YAMLError as exc:
        return documents, InvalidObject(source, [f"document {len(documents) + 1}: invalid YAML: {exc}"])
    finally:
        loader.dispose()
    return documents, None


def duplicate_keys(node: yaml.Node) -> list[tuple[str, yaml.Mark]]:
    """Keys that appear twice in one mapping, with where the later one is: YAML forbids them, yet
    kubectl takes the last value (so does PyYAML) and the API server never sees the others."""
    found = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in current.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    if key_node.value in seen:
                        found.append((key_node.value, key_node.start_mark))
                    seen.add(key_node.value)
                stack += [key_node, value_node]
        elif isinstance(current, yaml.SequenceNode):
            stack += current.value
    return sorted(found, key=lambda item: item[1].index)


def _syntax_error(source: str, exc: yaml.MarkedYAMLError, index: int, text: str) -> InvalidObject:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or "invalid YAML"
    if exc.context:
        problem = f"{problem} ({exc.context}"
        if exc.context_mark is not None and exc.context_mark is not mark:
            problem += f" at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
        problem += ")"
    which = f"document {index}: " if index > 1 or re.search(r"^---", text, re.M) else ""
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    return InvalidObject(where, [f"{which}invalid YAML: {problem}"])


def load_catalog(directory: Path | None = None) -> dict[str, BenchmarkTask]:
    """Every task in the catalog by name; invalid files fail loudly with the field named."""
    directory = directory or catalog_dir()
    tasks: dict[str, BenchmarkTask] = {}
    for path in sorted(directory.glob("*.yaml")):
        for doc in load_documents(path):
            if doc.get("kind") != "BenchmarkTask":
                continue
            task = parse_task(doc, str(path))
            if task.metadata.name in tasks:
                raise InvalidObject(str(path), [f"metadata.name: duplicate task {task.metadata.name!r}"])
            tasks[task.metadata.name] = task
    return tasks


def get_task(name: str, directory: Path | None = None) -> BenchmarkTask:
    tasks = load_catalog(directory)
    try:
        return tasks[name]
    except KeyError:
        known = ", ".join(sorted(tasks)) or "none"
        raise KeyError(f"spec.taskRef.name: no task {name!r} in the catalog (known: {known})") from None
