"""``BenchmarkSweep``: a study declared once (a run template and a matrix) that yields its runs.

The expansion (:func:`expand`) is pure and shared by the operator, which creates the runs a few
at a time (``spec.maxConcurrent``), and by ``mlbench sweep``, which runs them here one after
another (``--local``) or prints them as plain BenchmarkRuns for GitOps.

Order: workers, then algorithms, then backends, then seeds (the innermost), each in the order the
matrix lists them. Names: ``<sweep>-w<workers>-<algorithm>-<backend>-s<seed>`` with only the
dimensions the matrix lists (``ar`` is allreduce-sgd), e.g. ``study-w2-s1``; a name longer than
:data:`MAX_RUN_NAME` keeps its start and ends in a stable hash instead.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import JsonDict

from mlbench_api.catalog import strict_validate
from mlbench_api.common import API_VERSION, DNS1035_LABEL, GROUP, ApiModel, Condition, ObjectMeta, cel, re2_search
from mlbench_api.errors import format_errors
from mlbench_api.parameters import PARAMETER_DEFAULTS, AlgorithmParameters
from mlbench_api.run import DDP_NEEDS_TORCH_BACKEND, MAX_RUN_NAME, MAX_WORKERS, Backend, BenchmarkRunSpec
from mlbench_api.runstatus import Phase
from mlbench_api.training import Algorithm

#: Most runs one sweep may expand to (the product of the matrix's list lengths).
MAX_SWEEP_RUNS = 256

#: On every run of a sweep: the sweep's name (what the operator and ``kubectl get br -l`` select by).
LABEL_SWEEP = f"{GROUP}/sweep"
#: On every run of a sweep: its value of each matrix dimension (listed in the matrix or not).
LABEL_WORKERS = f"{GROUP}/sweep-workers"
LABEL_ALGORITHM = f"{GROUP}/sweep-algorithm"
LABEL_BACKEND = f"{GROUP}/sweep-backend"
LABEL_SEED = f"{GROUP}/sweep-seed"

#: The algorithm's part of a run name.
ALGORITHM_SHORT = {
    Algorithm.ALLREDUCE_SGD: "ar",
    Algorithm.DDP: "ddp",
    Algorithm.CENTRALIZED_ADAM: "cadam",
    Algorithm.POWERSGD: "psgd",
    Algorithm.DECENTRALIZED_SGD: "dsgd",
    Algorithm.SIGN_SGD: "sign",
    Algorithm.SPARSIFIED_SGD: "ssgd",
}
#: Hex digits of the hash that ends a name too long to be spelled out.
HASH_LENGTH = 8


class FailurePolicy(StrEnum):
    """What a failed run does to the rest of the sweep."""

    CONTINUE = "Continue"  #: the other runs go on (a study wants every point)
    STOP = "Stop"  #: no further run is created; the sweep ends once the unfinished ones finish


def _unique(values: list[Any] | None) -> list[Any] | None:
    if values is not None and len(set(values)) != len(values):
        raise ValueError("values must be unique (each one names runs)")
    return values


#: A matrix list is a set on the API server too (duplicates refused).
_SET: JsonDict = {"x-kubernetes-list-type": "set"}


class SweepMatrix(ApiModel):
    """The values each run varies; a dimension not listed keeps the template's value."""

    workers: Annotated[list[Annotated[int, Field(ge=1, le=MAX_WORKERS)]], Field(min_length=1, max_length=64)] | None = (
        Field(default=None, json_schema_extra=_SET)
    )
    """Worker counts (each 1 to 1024, at most 64 values, no repeats); unset: template.workers."""
    seeds: Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(min_length=1, max_length=256)] | None = (
        Field(default=None, json_schema_extra=_SET)
    )
    """Seeds (each 0 to 2^31-1, at most 256 values, no repeats); unset: template.seed."""
    algorithms: Annotated[list[Algorithm], Field(min_length=1, max_length=len(Algorithm))] | None = Field(
        default=None, json_schema_extra=_SET
    )
    """Algorithms (spec.algorithm values, no repeats); unset: template.algorithm. Each run keeps only the
    template.algorithmParameters that belong to its algorithm."""
    backends: Annotated[list[Backend], Field(min_length=1, max_length=3)] | None = Field(
        default=None, json_schema_extra=_SET
    )
    """Backends (gloo, nccl, mpi; no repeats); unset: template.backend. nccl needs template.resources.gpu >= 1."""

    _check_unique = field_validator("workers", "seeds", "algorithms", "backends")(_unique)

    def size(self) -> int:
        """How many runs the matrix expands to."""
        return (
            len(self.workers or [0]) * len(self.seeds or [0]) * len(self.algorithms or [0]) * len(self.backends or [0])
        )


def _size_rule() -> str:
    dims = ("workers", "seeds", "algorithms", "backends")
    return (
        " * ".join(f"(has(self.matrix) && has(self.matrix.{d}) ? size(self.matrix.{d}) : 1)" for d in dims)
        + f" <= {MAX_SWEEP_RUNS}"
    )


def _spec_rules(schema: dict[str, Any]) -> None:
    """CEL rules of the sweep spec: what the per-run rules of the expansion would refuse, named at the matrix."""
    algorithms = "has(self.matrix) && has(self.matrix.algorithms)"
    backends = "has(self.matrix) && has(self.matrix.backends)"
    schema["x-kubernetes-validations"] = [
        cel(_size_rule(), f"the matrix expands to more than {MAX_SWEEP_RUNS} runs", ".matrix"),
        cel(
            f"!({backends}) || !('nccl' in self.matrix.backends) || "
            "(has(self.template.resources) && self.template.resources.gpu >= 1)",
            "nccl needs template.resources.gpu >= 1",
            ".matrix.backends",
        ),
        cel(
            f"!({algorithms}) || !('ddp' in self.matrix.algorithms) || "
            f"({backends} ? !('mpi' in self.matrix.backends) : self.template.backend != 'mpi')",
            DDP_NEEDS_TORCH_BACKEND,
            ".matrix.algorithms",
        ),
        cel(
            f"({algorithms}) || !({backends}) || !('mpi' in self.matrix.backends) || self.template.algorithm != 'ddp'",
            DDP_NEEDS_TORCH_BACKEND,
            ".matrix.backends",
        ),
        *_parameters_of_the_sweep_rules(),
        cel(
            "has(self.matrix) == has(oldSelf.matrix) && (!has(self.matrix) || self.matrix == oldSelf.matrix)",
            "matrix is immutable (its runs are named after it)",
            ".matrix",
            reason="FieldValueForbidden",
        ),
    ]


class SweepTemplate(BenchmarkRunSpec):
    """The spec of every run of a sweep, as a BenchmarkRun's spec; algorithmParameters may hold the parameters
    of every algorithm the sweep runs, and each run keeps its own algorithm's."""

    PARAMETERS_OF_ITS_ALGORITHM: ClassVar[bool] = False
    PODS_CARRY_THE_DEADLINE: ClassVar[bool] = False

    algorithm_parameters: AlgorithmParameters | None = None
    """Parameters of template.algorithm and of every algorithm of matrix.algorithms (powersgd: rank, warmStart;
    decentralized-sgd: topology; sparsified-sgd: density, selection); each run keeps those of its own algorithm."""


def _parameters_of_the_sweep_rules() -> list[dict[str, Any]]:
    """Each template parameter only with an algorithm of the sweep: template.algorithm (as a run's spec allows,
    also when the matrix leaves it out: sweeps valid before stay valid) or one of matrix.algorithms."""
    return [
        cel(
            f"!has(self.template.algorithmParameters) || !has(self.template.algorithmParameters.{name}) || "
            f"self.template.algorithm == '{owner.value}' || "
            f"(has(self.matrix) && has(self.matrix.algorithms) && '{owner.value}' in self.matrix.algorithms)",
            f"template.algorithmParameters.{name} is for algorithm {owner.value} only, which is neither "
            "template.algorithm nor in matrix.algorithms",
            f".template.algorithmParameters.{name}",
        )
        for name, (owner, _default) in PARAMETER_DEFAULTS.items()
    ]


class BenchmarkSweepSpec(ApiModel):
    """A run template and the matrix of values its runs vary; the template and matrix are immutable."""

    model_config = ConfigDict(json_schema_extra=_spec_rules)

    template: SweepTemplate
    """The spec of every run, as a BenchmarkRun's spec; the matrix replaces workers, seed, algorithm and backend.
    algorithmParameters may hold the parameters of every algorithm of matrix.algorithms: each run keeps its own."""
    matrix: SweepMatrix | None = None
    """The values the runs vary (their product, at most 256 runs); unset: one run, the template."""
    max_concurrent: Annotated[int, Field(ge=1, le=MAX_SWEEP_RUNS)] = 1
    """Runs created and not yet finished at any time (1 to 256, default 1: a study does not ask for the whole
    cluster at once); may be changed while the sweep goes on."""
    failure_policy: FailurePolicy = FailurePolicy.CONTINUE
    """Continue (default: a failed run does not stop the others) or Stop (no further run is created after a
    failure)."""

    def listed(self) -> set[str]:
        """The matrix dimensions this sweep varies (``algorithms``, ``seeds``, ...)."""
        return {k for k, v in (self.matrix or SweepMatrix()) if v is not None}

    @model_validator(mode="after")
    def _expansion(self) -> BenchmarkSweepSpec:
        matrix = self.matrix or SweepMatrix()
        if matrix.size() > MAX_SWEEP_RUNS:
            raise ValueError(f"matrix: expands to {matrix.size()} runs, more than {MAX_SWEEP_RUNS}")
        parameters = self.template.algorithm_parameters
        unused = parameters.misplaced(self.template.algorithm, *(matrix.algorithms or [])) if parameters else []
        if unused:
            owner = PARAMETER_DEFAULTS[unused[0]][0].value
            raise ValueError(
                f"template.algorithmParameters.{unused[0]}: is for algorithm {owner} only, which is neither "
                "template.algorithm nor in matrix.algorithms"
            )
        for point in _points(self):
            _run_spec(self, point)  # raises naming the matrix field of the first invalid combination
        return self


class SweepRunState(ApiModel):
    """One run of the expansion and how far it got."""

    name: Annotated[str, Field(max_length=63)]
    """The run's name (BenchmarkRun metadata.name)."""
    phase: Phase | None = None
    """The run's phase; unset: not created yet. Succeeded or Failed is kept after the run is deleted."""


class BenchmarkSweepStatus(ApiModel):
    """What the operator observed; written only by the operator (the status subresource)."""

    total: Annotated[int, Field(ge=0)] | None = None
    """Runs the matrix expands to."""
    pending: Annotated[int, Field(ge=0)] | None = None
    """Runs not created yet (waiting for a free slot of maxConcurrent)."""
    running: Annotated[int, Field(ge=0)] | None = None
    """Runs created and not finished (phase Pending, Starting or Running)."""
    succeeded: Annotated[int, Field(ge=0)] | None = None
    """Runs that succeeded."""
    failed: Annotated[int, Field(ge=0)] | None = None
    """Runs that failed."""
    runs: Annotated[list[SweepRunState], Field(max_length=MAX_SWEEP_RUNS)] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Every run of the expansion in order, with its phase."""
    conditions: Annotated[list[Condition], Field(max_length=8)] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready (True once every run finished), Reconciling (True while runs remain) and Stalled (True when the
    sweep cannot go on by itself: InvalidSpec, NameConflict, CreateFailed, or RunFailed with failurePolicy Stop)."""
    observed_generation: int | None = None
    """The metadata.generation of the spec this status reflects."""
    start_time: datetime | None = None
    """When the operator first saw the sweep (RFC 3339)."""
    completion_time: datetime | None = None
    """When the last run finished, or the sweep stopped (RFC 3339)."""
    message: Annotated[str, Field(max_length=32768)] | None = None
    """One line for humans: how far the sweep is, or why it is stuck."""


class BenchmarkSweep(ApiModel):
    """``mlbench.io/v1alpha1 BenchmarkSweep`` (namespaced, short name ``bsw``)."""

    api_version: Literal["mlbench.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["BenchmarkSweep"] = "BenchmarkSweep"
    metadata: ObjectMeta
    spec: BenchmarkSweepSpec
    status: BenchmarkSweepStatus | None = None

    @model_validator(mode="after")
    def _name(self) -> BenchmarkSweep:
        name = self.metadata.name
        if len(name) > MAX_RUN_NAME:
            raise ValueError(f"metadata.name: at most {MAX_RUN_NAME} characters (it starts the names of its runs)")
        if not re2_search(DNS1035_LABEL, name):
            raise ValueError("metadata.name: must be a DNS-1035 label (lowercase letter first; a-z, 0-9, '-')")
        return self


# -- the expansion ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """One combination of the matrix's values."""

    workers: int
    algorithm: Algorithm
    backend: Backend
    seed: int


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its name, labels and spec (the owner reference is the operator's)."""

    name: str
    point: Point
    spec: BenchmarkRunSpec
    labels: dict[str, str] = field(default_factory=dict)

    def to_api(self, namespace: str | None = None) -> dict[str, Any]:
        """The BenchmarkRun object (as ``kubectl apply`` takes it)."""
        metadata: dict[str, Any] = {"name": self.name}
        if namespace:
            metadata["namespace"] = namespace
        metadata["labels"] = dict(self.labels)
        return {"apiVersion": API_VERSION, "kind": "BenchmarkRun", "metadata": metadata, "spec": self.spec.to_api()}


def _points(spec: BenchmarkSweepSpec) -> list[Point]:
    t, m = spec.template, spec.matrix or SweepMatrix()
    return [
        Point(workers=w, algorithm=a, backend=b, seed=s)
        for w, a, b, s in itertools.product(
            m.workers or [t.workers], m.algorithms or [t.algorithm], m.backends or [t.backend], m.seeds or [t.seed]
        )
    ]


#: Which matrix list supplies each run spec field.
#: A run spec field a sweep's matrix may vary, and the matrix list that varies it.
MATRIX_FIELD = {"workers": "workers", "seed": "seeds", "algorithm": "algorithms", "backend": "backends"}


def _culprit(spec: BenchmarkSweepSpec, run_field: str) -> str:
    """The sweep field to name for a run spec field that failed: its matrix list when the matrix lists it (for
    algorithm/backend pairs, the other one's list when only that one is listed), else the template's field."""
    listed = spec.listed()
    key = MATRIX_FIELD.get(run_field)
    if key in listed:
        return f"matrix.{key}"
    partner = {"algorithm": "backends", "backend": "algorithms"}.get(run_field)
    if partner in listed:
        return f"matrix.{partner}"
    return f"template.{run_field}"


def _run_spec(spec: BenchmarkSweepSpec, point: Point) -> BenchmarkRunSpec:
    """The template with the point's values, validated by BenchmarkRunSpec's own rules."""
    data = spec.template.model_dump(by_alias=True, exclude_none=True)
    data.update(workers=point.workers, algorithm=point.algorithm, backend=point.backend, seed=point.seed)
    parameters = spec.template.algorithm_parameters
    if parameters is not None:  # each run keeps its own algorithm's (the sweep refused any no run uses)
        kept = parameters.model_dump(by_alias=True, exclude_none=True)
        for name in parameters.misplaced(point.algorithm):
            del kept[name]
        data["algorithmParameters"] = kept
        if not kept:
            del data["algorithmParameters"]
    try:
        return BenchmarkRunSpec.model_validate(data)
    except ValidationError as exc:
        problem = format_errors(exc)[0]
        run_field, _, message = problem.partition(": ")
        where = (
            f"workers={point.workers} algorithm={point.algorithm.value} backend={point.backend.value} seed={point.seed}"
        )
        raise ValueError(f"{_culprit(spec, run_field.split('.')[0])}: {message} (the run with {where})") from None


def _slug(point: Point, listed: set[str]) -> list[str]:
    parts = []
    if "workers" in listed:
        parts.append(f"w{point.workers}")
    if "algorithms" in listed:
        parts.append(ALGORITHM_SHORT[point.algorithm])
    if "backends" in listed:
        parts.append(point.backend.value)
    if "seeds" in listed:
        parts.append(f"s{point.seed}")
    return parts


def run_name(sweep: str, parts: list[str]) -> str:
    """``<sweep>-<part>-<part>...``; longer than MAX_RUN_NAME: cut, and ended by a hash of the full name."""
    full = "-".join([sweep, *parts])
    if len(full) <= MAX_RUN_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:HASH_LENGTH]
    return f"{full[: MAX_RUN_NAME - HASH_LENGTH - 1].rstrip('-')}-{digest}"


def run_labels(sweep: str, point: Point, sweep_labels: dict[str, str] | None = None) -> dict[str, str]:
    """The sweep's own labels, the sweep label and one label per dimension (ours win over the sweep's)."""
    return {
        **(sweep_labels or {}),
        LABEL_SWEEP: sweep,
        LABEL_WORKERS: str(point.workers),
        LABEL_ALGORITHM: point.algorithm.value,
        LABEL_BACKEND: point.backend.value,
        LABEL_SEED: str(point.seed),
    }


def expand(sweep: BenchmarkSweep) -> list[SweepRun]:
    """Every run of the sweep, in order (workers, algorithms, backends, seeds; seeds innermost)."""
    spec, name = sweep.spec, sweep.metadata.name
    listed = spec.listed()
    runs = [
        SweepRun(
            name=run_name(name, _slug(point, listed)),
            point=point,
            spec=_run_spec(spec, point),
            labels=run_labels(name, point, sweep.metadata.labels),
        )
        for point in _points(spec)
    ]
    names = [r.name for r in runs]
    if len(set(names)) != len(names):  # only a hash collision could do it
        raise ValueError("metadata.name: two runs of the expansion got the same name")
    return runs


def parse_sweep(doc: dict[str, Any], source: str = "<input>") -> BenchmarkSweep:
    """A BenchmarkSweep, or :class:`InvalidObject` with one ``field: message`` line per problem.

    As strict as ``mlbench validate`` and the API server (``workers: ["4"]`` is refused, not read as 4):
    ``mlbench sweep`` must not run a study that ``kubectl apply`` would refuse.
    """
    return strict_validate(BenchmarkSweep, doc, source)
