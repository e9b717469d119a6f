"""Shared building blocks: the base model, Kubernetes-shaped helpers and schema hints.

Schema hints (``x-kubernetes-*`` keys, CEL rules) ride along in pydantic's
``json_schema_extra`` so that ``mlbench_api.crdgen`` can turn the JSON schema into a
structural CRD schema without a second description of the API.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

GROUP = "mlbench.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
#: The kinds of the API group (each also has its ``<Kind>List``).
KINDS = ("BenchmarkRun", "BenchmarkTask", "BenchmarkSweep")

#: DNS-1035 label: what a Service name (the run's headless Service) must be.
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
#: DNS-1123 label: a namespace's name (at most 63 characters, checked apart).
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: DNS-1123 subdomain, the usual object name.
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

#: Kubernetes' quantity grammar (k8s.io/apimachinery resource.Quantity): a number, then at most one suffix,
#: binary SI (Ki Mi Gi Ti Pi Ei), decimal SI (n u m k M G T P E: a lowercase k, no K) or a decimal exponent (e3, E-2).
#: The one copy: the CRDs' schema pattern, the API models and the operator's settings all check against it.
QUANTITY = r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+|[KMGTPE]i|[numkMGTPE])?$"


def re2_search(pattern: str, text: str) -> bool:
    """Whether ``text`` matches ``pattern`` as the API server's RE2 finds it (an OpenAPI ``pattern``, CEL's
    ``matches``): searched, unanchored, ``$`` only at the very end, and ``\\d`` only 0-9. Python's ``$`` also
    matches before a final newline and its ``\\d`` any Unicode digit, so ``"4Gi\\n"``, a name ``"r1\\n"`` or
    a quantity in Arabic-Indic digits passed here and was refused there. The patterns of this package use
    ``$`` only as that anchor."""
    return re.search(pattern.replace("$", r"\Z"), text, flags=re.ASCII) is not None


def cel(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict[str, Any]:
    """One ``x-kubernetes-validations`` entry (a CEL rule evaluated by the API server)."""
    entry: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry


class ApiModel(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields rejected.

    A string literal right under a field is that field's description (pydantic's
    ``use_attribute_docstrings``): it lands in the generated CRD, so ``kubectl explain``
    shows it. ``Field(description=...)`` also works and wins when both are given.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The object as the Kubernetes API carries it: camelCase, no nulls."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


#: The longest quantity string the CRDs take.
MAX_QUANTITY_LENGTH = 64


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and len(value) > MAX_QUANTITY_LENGTH:
        raise ValueError(f"a quantity is at most {MAX_QUANTITY_LENGTH} characters")
    if isinstance(value, str) and not re2_search(QUANTITY, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 2, 500m, 4Gi)")
    if not isinstance(value, str) and value < 0:
        raise ValueError("a quantity must not be negative")
    return value


#: A resource quantity such as ``2``, ``500m`` or ``8Gi`` (int-or-string on the wire).
Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": QUANTITY, "maxLength": MAX_QUANTITY_LENGTH},
            ],
        }
    ),
]

#: Free-form Kubernetes object (e.g. a core/v1 VolumeSource) that the API passes through.
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]

#: Largest integer that every JSON reader (the API server's, kubectl's, JavaScript's float64) keeps exact;
#: the API server refuses a larger integer in a status, so such a value must never reach a patch.
MAX_SAFE_INT = 2**53 - 1
#: An integer the API server can store and give back unchanged.
SafeInt = Annotated[int, Field(ge=-MAX_SAFE_INT, le=MAX_SAFE_INT)]
#: A float that JSON can carry: NaN and +-Infinity are not JSON, and the API server refuses them.
Finite = Annotated[float, Field(allow_inf_nan=False)]
#: Largest value of an int32 field such as a Job's ttlSecondsAfterFinished or a Pod's
#: activeDeadlineSeconds (validated as 1..2^31-1 by the API server).
MAX_INT32 = 2**31 - 1

ShortString = Annotated[str, Field(max_length=253)]
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)]
#: Longest label value: a name that becomes one (a task's, as the ``mlbench.io/task`` label of its runs' pods).
MAX_LABEL_VALUE = 63
#: An object name that is also used as a label value: a DNS-1123 subdomain of at most 63 characters.
LabelName = Annotated[str, Field(min_length=1, max_length=MAX_LABEL_VALUE, pattern=DNS1123_SUBDOMAIN)]


class Condition(ApiModel):
    """A status condition shaped exactly like ``metav1.Condition``."""

    type: Annotated[str, Field(min_length=1, max_length=316)]
    """Which aspect of the run this condition is about, e.g. WorkersReady, Running, GoalReached, Failed."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds: True, False or Unknown."""
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")]
    """Why it is in this status, as one CamelCase word for programs (e.g. OOMKilled, Unschedulable)."""
    message: Annotated[str, Field(max_length=32768)] = ""
    """Why it is in this status, for humans; may be empty."""
    last_transition_time: datetime
    """When status last changed (RFC 3339); a new reason or message with the same status does not move it."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The run's metadata.generation the operator had seen when it set this condition."""


class ObjectMeta(ApiModel):
    """The subset of ``metav1.ObjectMeta`` that the models read; the rest passes through."""

    model_config = ConfigDict(extra="allow")

    name: Annotated[str, Field(max_length=253)]
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
