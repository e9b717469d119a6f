"""``spec.pod``: what multi-node GPU training needs of the worker pods (issue 29), beyond what MLBench sets itself.

Environment variables (``NCCL_*``, ``UCX_*``...), annotations and labels (a Multus network attachment), extended
resources besides ``nvidia.com/gpu`` (RDMA devices, EFA adapters), affinity and topology spread, ``hostNetwork`` and
``hostIPC``. The shape is checked here (names, keys, bounds); whether the cluster allows each is the operator's
admission policy's business (mlbench_operator.policy: anything that widens privilege is refused by default).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

from mlbench_api import contract
from mlbench_api.common import MAX_LABEL_VALUE, ApiModel, FreeForm, Name, cel, re2_search

#: An environment variable's name as a shell (and ``mpirun -x``) takes it: a C identifier.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: A Kubernetes qualified name: an optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters.
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
#: An extended resource: a qualified name with a domain prefix (``rdma/hca_shared_devices_a``).
EXTENDED_RESOURCE = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
#: The GPUs are ``spec.resources.gpu``'s (the operator sets them, and backend nccl checks them).
GPU_RESOURCE = "nvidia.com/gpu"
#: Label and annotation prefixes that are MLBench's own (its pods' selectors, its bookkeeping).
RESERVED_KEY_PREFIX = "mlbench.io/"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
MAX_ENV = 64
MAX_KEYS = 32
#: At most this many ``imagePullSecrets`` per run (the kubelet tries each in turn).
MAX_PULL_SECRETS = 8


def reserved_env(name: str) -> bool:
    """Whether ``name`` belongs to the operator-runner contract (``MLBENCH_*``, the ranks' world)."""
    return name in contract.RESERVED_ENV or name.startswith(contract.RESERVED_ENV_PREFIXES)


def reserved_key(key: str) -> bool:
    """Whether a label or annotation key is under ``mlbench.io/`` (the CRD's rule says the same with
    ``startsWith``, whose cost is the prefix's: the API server cannot bound a map key's length)."""
    return key.startswith(RESERVED_KEY_PREFIX)


class EnvVar(ApiModel):
    """One environment variable of the run's pods (a literal value: no references to Secrets or fields)."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=ENV_NAME)]
    """The variable's name, a C identifier (e.g. NCCL_SOCKET_IFNAME); not MLBENCH_* nor a name the pods rely on."""
    value: Annotated[str, Field(max_length=4096)] = ""
    """Its value (default empty)."""


class SecretReference(ApiModel):
    """A Secret of the run's namespace, by name (a core/v1 LocalObjectReference)."""

    name: Name
    """The Secret's name (a DNS-1123 subdomain), e.g. regcred: a kubernetes.io/dockerconfigjson Secret."""


def _pod_rules(schema: dict[str, Any], cls: type[Any]) -> None:
    reserved = " || ".join(
        [f"e.name == '{n}'" for n in contract.RESERVED_ENV]
        + [f"e.name.startsWith('{p}')" for p in contract.RESERVED_ENV_PREFIXES]
    )
    schema["x-kubernetes-validations"] = [
        cel(f"!has(self.env) || !self.env.exists(e, {reserved})", RESERVED_ENV_MESSAGE, ".env"),
        cel(
            f"!has(self.annotations) || self.annotations.all(k, !k.startsWith('{RESERVED_KEY_PREFIX}'))",
            RESERVED_KEY_MESSAGE,
            ".annotations",
        ),
        cel(
            f"!has(self.labels) || self.labels.all(k, !k.startsWith('{RESERVED_KEY_PREFIX}'))",
            RESERVED_KEY_MESSAGE,
            ".labels",
        ),
        cel(
            f"!has(self.extendedResources) || !('{GPU_RESOURCE}' in self.extendedResources)",
            f"{GPU_RESOURCE} is resources.gpu's",
            ".extendedResources",
        ),
    ]


RESERVED_ENV_MESSAGE = (
    "MLBENCH_* and the variables of the ranks' world (" + ", ".join(contract.RESERVED_ENV) + ", "
    "OMPI_COMM_WORLD_*, PMIX_*) are the operator's and the runner's"
)
RESERVED_KEY_MESSAGE = f"keys under {RESERVED_KEY_PREFIX} are MLBench's own"

Annotations = Annotated[dict[str, Annotated[str, Field(max_length=4096)]], Field(max_length=MAX_KEYS)]
Labels = Annotated[
    dict[str, Annotated[str, Field(max_length=MAX_LABEL_VALUE, pattern=LABEL_VALUE)]], Field(max_length=MAX_KEYS)
]


class PodSettings(ApiModel):
    """What the run's worker pods get besides MLBench's own settings, for multi-node GPU training: each allowed or
    refused by the operator's admission policy (docs/operator.md#gpu-clusters; privilege-widening ones are off by
    default)."""

    model_config = ConfigDict(json_schema_extra=_pod_rules)

    env: (
        Annotated[
            list[EnvVar],
            Field(
                max_length=MAX_ENV,
                json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
            ),
        ]
        | None
    ) = None
    """Environment variables of the workers and the launcher, forwarded to every rank (mpirun -x): e.g. NCCL_DEBUG,
    NCCL_SOCKET_IFNAME, NCCL_IB_HCA. Names unique; not MLBENCH_* nor the ranks' world (RANK, MASTER_ADDR...)."""
    annotations: Annotations | None = None
    """Annotations of the worker pods (e.g. k8s.v1.cni.cncf.io/networks for a Multus attachment); keys under
    mlbench.io/ are refused."""
    labels: Labels | None = None
    """Labels of the worker pods; keys under mlbench.io/ are refused (MLBench's own selectors)."""
    extended_resources: Annotated[dict[str, Annotated[int, Field(ge=1, le=1024)]], Field(max_length=8)] | None = None
    """Extended resources per worker besides nvidia.com/gpu (resources.gpu's), requests = limits, whole numbers:
    e.g. rdma/hca_shared_devices_a: 1, vpc.amazonaws.com/efa: 4."""
    affinity: FreeForm | None = None
    """A core/v1 Affinity for the worker pods; merged with what scheduling.placement adds (both hold)."""
    topology_spread_constraints: Annotated[list[FreeForm], Field(max_length=8)] | None = None
    """core/v1 TopologySpreadConstraints for the worker pods, after those of scheduling.placement."""
    image_pull_secrets: (
        Annotated[
            list[SecretReference],
            Field(
                max_length=MAX_PULL_SECRETS,
                json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
            ),
        ]
        | None
    ) = None
    """Secrets of the run's namespace the kubelet pulls the image with (names only, unique), on the workers, the
    launcher and the dataset fetch Job, for a private registry. Named here, they replace the imagePullSecrets of
    the namespace's default service account (which apply when the run names none)."""
    host_network: bool | None = None
    """Workers in the node's network namespace (dnsPolicy ClusterFirstWithHostNet): only where the admin allows it."""
    host_ipc: bool | None = None
    """Workers in the node's IPC namespace: only where the admin allows it."""

    @model_validator(mode="after")
    def _rules(self) -> PodSettings:
        names = [e.name for e in self.env or []]
        reserved = [n for n in names if reserved_env(n)]
        if reserved:
            raise ValueError(f"env: {reserved[0]!r}: {RESERVED_ENV_MESSAGE}")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"env: {twice[0]!r} is set twice")
        secrets = [s.name for s in self.image_pull_secrets or []]
        repeated = sorted({s for s in secrets if secrets.count(s) > 1})
        if repeated:
            raise ValueError(f"imagePullSecrets: {repeated[0]!r} is named twice")
        for field, keys in (("annotations", self.annotations or {}), ("labels", self.labels or {})):
            for key in keys:
                _check_key(field, key)
        for key in self.extended_resources or {}:
            if key == GPU_RESOURCE:
                raise ValueError(f"extendedResources: {GPU_RESOURCE} is resources.gpu's")
            if len(key.rpartition("/")[2]) > MAX_LABEL_VALUE or not re2_search(EXTENDED_RESOURCE, key):
                raise ValueError(f"extendedResources: {key!r} is not an extended resource name (domain/name)")
        return self


def _check_key(field: str, key: str) -> None:
    if len(key.rpartition("/")[2]) > MAX_LABEL_VALUE or not re2_search(QUALIFIED_NAME, key):
        raise ValueError(f"{field}: {key!r} is not a valid key ([prefix/]name)")
    if reserved_key(key):
        raise ValueError(f"{field}: {key!r}: {RESERVED_KEY_MESSAGE}")


#: Settings given as one value (a run that sets one replaces the task's whole value).
WHOLE_FIELDS = ("affinity", "topology_spread_constraints", "host_network", "host_ipc")
#: Settings given as maps (by key) whose keys merge: the run's value wins on a shared key.
KEYED_FIELDS = ("annotations", "labels", "extended_resources")


def merge(task: PodSettings | None, run: PodSettings | None) -> PodSettings | None:
    """The pod settings a run's pods get: its task's (``BenchmarkTask.spec.pod``) under its own (``spec.pod``).

    Keyed settings merge by key (env by name, annotations, labels and extendedResources by key, imagePullSecrets
    by name), the run's value winning on a shared key and the task's keys first; a setting given as one value
    (affinity, topologySpreadConstraints, hostNetwork, hostIpc) is the run's when it sets it, else the task's.
    In the closed division a run may not change what the task sets (:func:`contradictions`)."""
    if task is None or run is None:
        return run if task is None else task
    update: dict[str, Any] = {f: getattr(run, f) for f in WHOLE_FIELDS if getattr(run, f) is not None}
    for f in KEYED_FIELDS:
        ours, theirs = getattr(task, f), getattr(run, f)
        if ours is not None or theirs is not None:
            update[f] = {**(ours or {}), **(theirs or {})}
    given = {e.name: e for e in run.env or []}
    env = [given.pop(e.name, e) for e in task.env or []] + list(given.values())
    secrets = list(task.image_pull_secrets or [])
    secrets += [s for s in run.image_pull_secrets or [] if s not in secrets]
    update["env"] = env or None
    update["image_pull_secrets"] = secrets or None
    return task.model_copy(update=update)


def _wire(field: str) -> str:
    """A field's wire name (``extended_resources`` -> ``extendedResources``)."""
    return PodSettings.model_fields[field].alias or field


def contradictions(task: PodSettings | None, run: PodSettings | None) -> list[str]:
    """Where ``run`` changes a pod setting ``task`` sets, each as ``spec.pod.<field>[<key>]: ...`` (empty: none).
    Adding a key or a setting the task leaves unset is no contradiction; imagePullSecrets never contradict."""
    if task is None or run is None:
        return []
    out = []
    ours = {e.name: e.value for e in task.env or []}
    for e in run.env or []:
        if e.name in ours and ours[e.name] != e.value:
            out.append(f"spec.pod.env[{e.name}]: the task sets {ours[e.name]!r}, the run {e.value!r}")
    for f in KEYED_FIELDS:
        mine, theirs = getattr(task, f) or {}, getattr(run, f) or {}
        out += [
            f"spec.pod.{_wire(f)}[{k}]: the task sets {mine[k]!r}, the run {v!r}"
            for k, v in theirs.items()
            if k in mine and mine[k] != v
        ]
    for f in WHOLE_FIELDS:
        mine, theirs = getattr(task, f), getattr(run, f)
        if mine is not None and theirs is not None and mine != theirs:
            out.append(f"spec.pod.{_wire(f)}: the task sets {mine!r}, the run {theirs!r}")
    return out
