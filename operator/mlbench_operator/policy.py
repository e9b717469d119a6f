"""What a run may ask of the cluster: the cluster admin's admission policy for BenchmarkRuns.

A BenchmarkRun author is a namespace user, not a cluster admin, yet a run's pods are built from
fields anyone with ``edit`` can set: ``spec.image`` (and the task's ``runner.image``),
``scheduling.priorityClassName``, tolerations and node selectors, and the task's free-form
``dataset.volume``. Unchecked, those create pods with any image, ``system-node-critical``
priority, on control-plane nodes, or with a ``hostPath`` volume. The operator checks the run
against this policy at admission (a run that breaks it fails with reason ``PolicyViolation`` and
a message naming the field, having created nothing). The defaults are safe; the admin widens them
with ``MLBENCH_ALLOWED_*`` and ``MLBENCH_ALLOW_*`` variables on the operator's Deployment
(``MLBENCH_ALLOW_NETWORK_EMULATION``: ``spec.network``, whose worker init container runs as root with
NET_ADMIN).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mlbench_operator import __version__
from mlbench_operator.env import SettingsError

#: Where ``make images`` puts both images without ``IMAGE_REPO`` (hack/images.sh): a name for images side-loaded into
#: the nodes, which no registry the project does not control can serve (``localhost`` is the node itself).
DEFAULT_IMAGE_REPO = "localhost/mlbench"
#: The runner image of a task that names none (``MLBENCH_RUNNER_IMAGE`` overrides it): what ``make images`` tags
#: with its default ``IMAGE_REPO``, at the project's version (pyproject.toml).
DEFAULT_RUNNER_IMAGE = f"{DEFAULT_IMAGE_REPO}/mlbench-runner:{__version__}"


def repository_patterns(image: str) -> tuple[str, str]:
    """Any tag or digest of ``image``'s repository: the images a run may use unless the admin lists others."""
    ref = normalize_image(image).split("@", 1)[0]
    slash = ref.rfind("/")
    repository = ref[: slash + 1] + ref[slash + 1 :].split(":", 1)[0]
    return f"{repository}:*", f"{repository}@sha256:*"


#: Volume types ``dataset.volume`` may use by default: storage a namespace user could mount anyway. ``nfs`` is
#: outside the ``restricted`` Pod Security level: in such a namespace Pod Security admission refuses the pods
#: and the run fails ``PolicyViolation`` (``run.lifecycle.refusal_is_final``); it needs a ``baseline`` namespace.
DEFAULT_VOLUME_TYPES = ("persistentVolumeClaim", "nfs", "csi", "ephemeral", "configMap", "emptyDir")
#: Node roles a run may not select or tolerate unless allowed: benchmarks do not belong on them.
CONTROL_PLANE_KEYS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
#: ``nodeSelector`` keys a run may use by default: the well-known labels that choose hardware or place (none
#: of them reaches nodes set aside: those are tainted, and the tolerations are checked too).
DEFAULT_NODE_SELECTOR_KEYS = (
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "kubernetes.io/hostname",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "nvidia.com/gpu.present",
    "nvidia.com/gpu.product",
)
#: Taint keys a run may tolerate by default: the GPU device plugin's. Never ``node.kubernetes.io/*`` (a
#: cordoned, unreachable or pressured node) nor the control plane's: those nodes are not the tenants' to use.
DEFAULT_TOLERATION_KEYS = ("nvidia.com/gpu",)
#: ``spec.pod.env`` names a run may set by default: the collectives' and the RDMA transports' tuning (NCCL, UCX,
#: libfabric's EFA provider, gloo's interface). Never ``OMPI_MCA_*`` by default: the launcher's mpirun reads them
#: too, and ``plm_rsh_agent``/``plm_rsh_args`` would replace the ssh command and the strict host-key options the
#: operator gives it (an admin may list single parameters, e.g. ``OMPI_MCA_btl_tcp_if_include``). Never
#: ``LD_*``, ``PATH`` or ``PYTHON*`` by default: they choose what code the ranks load.
DEFAULT_ENV_NAMES = ("NCCL_*", "TORCH_NCCL_*", "UCX_*", "FI_EFA_*", "FI_PROVIDER", "GLOO_SOCKET_IFNAME")
#: ``spec.pod.annotations`` keys a run may set by default: Multus' network attachment (a secondary interface,
#: e.g. SR-IOV or RDMA, which its NetworkAttachmentDefinition in the namespace defines).
DEFAULT_POD_ANNOTATIONS = ("k8s.v1.cni.cncf.io/networks",)
#: ``spec.pod.labels`` keys a run may set by default: none (a label can make a pod match another Service's or a
#: NetworkPolicy's selector).
DEFAULT_POD_LABELS: tuple[str, ...] = ()
#: The one extended resource a run asks for without the admin's leave (spec.resources.gpu).
GPU_RESOURCE = "nvidia.com/gpu"
#: Node affinity operators that only narrow where a pod may go (never reach a node a selector could not).
NARROWING_OPERATORS = ("NotIn", "DoesNotExist")


def normalize_image(ref: str) -> str:
    """``mlbench/x:1`` and ``docker.io/mlbench/x:1`` are the same image; patterns and references are
    compared in the registry-qualified form (as the container runtime resolves them)."""
    first, _, rest = ref.partition("/")
    if not rest:  # "busybox:1" -> docker.io/library/busybox:1
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return "docker.io/" + rest if first == "index.docker.io" else ref
    return f"docker.io/{ref}"


#: Images a run may use by default: the default runner's repository, any tag or digest.
DEFAULT_IMAGES = repository_patterns(DEFAULT_RUNNER_IMAGE)


@dataclass(frozen=True)
class AdmissionPolicy:
    """The admin's limits on runs; ``from_env`` reads them (``*`` allows everything)."""

    images: tuple[str, ...] = DEFAULT_IMAGES
    #: The image of a task that names none (``MLBENCH_RUNNER_IMAGE``); its repository is the default of ``images``.
    runner_image: str = DEFAULT_RUNNER_IMAGE
    #: Empty: no run may set a priority class (one could preempt every other tenant's pods).
    priority_classes: tuple[str, ...] = ()
    #: ``nodeSelector`` keys and toleration keys (shell patterns; ``*`` also allows a toleration of every taint).
    node_selector_keys: tuple[str, ...] = DEFAULT_NODE_SELECTOR_KEYS
    toleration_keys: tuple[str, ...] = DEFAULT_TOLERATION_KEYS
    #: Adds the control-plane keys to both allowlists.
    allow_control_plane: bool = False
    volume_types: tuple[str, ...] = DEFAULT_VOLUME_TYPES
    #: ``spec.network`` (tc netem): the workers' init container runs as root with NET_ADMIN.
    allow_network_emulation: bool = False
    #: ``spec.pod``: environment names, annotation and label keys (shell patterns).
    env_names: tuple[str, ...] = DEFAULT_ENV_NAMES
    pod_annotations: tuple[str, ...] = DEFAULT_POD_ANNOTATIONS
    pod_labels: tuple[str, ...] = DEFAULT_POD_LABELS
    #: Extended resources besides nvidia.com/gpu (shell patterns, e.g. ``rdma/*``); empty: none.
    extended_resources: tuple[str, ...] = ()
    #: ``spec.pod.hostNetwork`` and ``hostIPC``: the node's network or IPC namespace.
    allow_host_network: bool = False
    allow_host_ipc: bool = False
    #: ``spec.scheduling.gang.schedulerName`` a run may name (shell patterns); empty: only the operator's own
    #: ``MLBENCH_GANG_SCHEDULER_NAME``, chosen by leaving it unset (another scheduler would skip the cluster's rules).
    scheduler_names: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AdmissionPolicy:
        """``MLBENCH_RUNNER_IMAGE``, ``MLBENCH_ALLOWED_IMAGES``, ``MLBENCH_ALLOWED_PRIORITY_CLASSES``,
        ``MLBENCH_ALLOWED_NODE_SELECTOR_KEYS``, ``MLBENCH_ALLOWED_TOLERATION_KEYS``, ``MLBENCH_ALLOWED_VOLUME_TYPES``
        (comma-separated; shell-style patterns but for volume types), ``MLBENCH_ALLOW_CONTROL_PLANE`` and
        ``MLBENCH_ALLOW_NETWORK_EMULATION`` (true/false), and those of ``spec.pod`` (:func:`_pod_settings`). Unset or
        empty: the default. Raises :class:`SettingsError` naming the variable."""
        runner_image = env.get("MLBENCH_RUNNER_IMAGE", "").strip() or DEFAULT_RUNNER_IMAGE
        if any(c in runner_image for c in "*?[ ,"):
            raise SettingsError(f"MLBENCH_RUNNER_IMAGE: expected an image reference, got {runner_image!r}")
        images = _patterns(env, "MLBENCH_ALLOWED_IMAGES")
        selectors = _patterns(env, "MLBENCH_ALLOWED_NODE_SELECTOR_KEYS")
        tolerations = _patterns(env, "MLBENCH_ALLOWED_TOLERATION_KEYS")
        volumes = _list(env, "MLBENCH_ALLOWED_VOLUME_TYPES")
        return cls(
            images=tuple(normalize_image(i) if i != "*" else i for i in images)
            if images
            else repository_patterns(runner_image),
            runner_image=runner_image,
            priority_classes=tuple(_patterns(env, "MLBENCH_ALLOWED_PRIORITY_CLASSES")),
            node_selector_keys=tuple(selectors) if selectors else DEFAULT_NODE_SELECTOR_KEYS,
            toleration_keys=tuple(tolerations) if tolerations else DEFAULT_TOLERATION_KEYS,
            allow_control_plane=_bool(env, "MLBENCH_ALLOW_CONTROL_PLANE"),
            volume_types=tuple(volumes) if volumes else DEFAULT_VOLUME_TYPES,
            allow_network_emulation=_bool(env, "MLBENCH_ALLOW_NETWORK_EMULATION"),
            scheduler_names=tuple(_patterns(env, "MLBENCH_ALLOWED_SCHEDULER_NAMES")),
            **_pod_settings(env),
        )


def _pod_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """``MLBENCH_ALLOWED_ENV``, ``MLBENCH_ALLOWED_POD_ANNOTATIONS``, ``MLBENCH_ALLOWED_POD_LABELS``,
    ``MLBENCH_ALLOWED_EXTENDED_RESOURCES`` (shell patterns; each replaces its default) and
    ``MLBENCH_ALLOW_HOST_NETWORK``, ``MLBENCH_ALLOW_HOST_IPC`` (true/false)."""
    names = _patterns(env, "MLBENCH_ALLOWED_ENV")
    annotations = _patterns(env, "MLBENCH_ALLOWED_POD_ANNOTATIONS")
    labels = _patterns(env, "MLBENCH_ALLOWED_POD_LABELS")
    return {
        "env_names": tuple(names) if names else DEFAULT_ENV_NAMES,
        "pod_annotations": tuple(annotations) if annotations else DEFAULT_POD_ANNOTATIONS,
        "pod_labels": tuple(labels) if labels else DEFAULT_POD_LABELS,
        "extended_resources": tuple(_patterns(env, "MLBENCH_ALLOWED_EXTENDED_RESOURCES")),
        "allow_host_network": _bool(env, "MLBENCH_ALLOW_HOST_NETWORK"),
        "allow_host_ipc": _bool(env, "MLBENCH_ALLOW_HOST_IPC"),
    }


def _bool(env: Mapping[str, str], key: str) -> bool:
    """``true`` or ``false`` (any case); unset or empty: false."""
    raw = env.get(key, "").strip().lower()
    if raw not in ("", "true", "false"):
        raise SettingsError(f"{key}={raw!r} must be true or false")
    return raw == "true"


def _list(env: Mapping[str, str], key: str) -> list[str]:
    items = [x.strip() for x in env.get(key, "").split(",")]
    if any(not x for x in items) and any(items):
        raise SettingsError(f"{key}={env.get(key)!r} has an empty entry")
    return [x for x in items if x]


def _patterns(env: Mapping[str, str], key: str) -> list[str]:
    """Shell patterns with ``*`` and ``?`` only: the admission policy (manifests/policy) turns them into
    regular expressions by escaping ``.`` and replacing those two, so a ``[...]`` class would mean one thing
    there and another (``[!x]``: not x) in ``fnmatch`` here."""
    items = _list(env, key)
    bracketed = [x for x in items if "[" in x or "]" in x]
    if bracketed:
        raise SettingsError(f"{key}: {bracketed[0]!r}: only * and ? are wildcards here (no [...] classes)")
    return items


def _matches(value: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _listed(patterns: tuple[str, ...]) -> str:
    return ", ".join(patterns) or "none"


def check_image(image: str, field: str, policy: AdmissionPolicy) -> list[str]:
    if _matches(normalize_image(image), policy.images):
        return []
    allowed = ", ".join(policy.images)
    return [f"{field}: image {image!r} is not allowed by the operator's policy (MLBENCH_ALLOWED_IMAGES: {allowed})"]


def check_listed(name: str | None, patterns: tuple[str, ...], field: str, rule: str, variable: str) -> list[str]:
    """A name the run chose (unset: nothing to check) only if it matches one of the admin's ``patterns``; else one
    violation naming ``field``, the ``rule`` and the ``variable`` that lists the patterns."""
    if not name or _matches(name, patterns):
        return []
    return [f"{field}: {name!r} is not allowed: {rule} ({variable}: {_listed(patterns)})"]


def check_priority(name: str | None, policy: AdmissionPolicy) -> list[str]:
    """A priority class only if the admin lists it: any other could preempt other tenants' pods."""
    return check_listed(
        name,
        policy.priority_classes,
        "spec.scheduling.priorityClassName",
        "a run may use only the priority classes the operator's admin lists",
        "MLBENCH_ALLOWED_PRIORITY_CLASSES",
    )


def _key_allowed(key: str, patterns: tuple[str, ...], policy: AdmissionPolicy) -> bool:
    return _matches(key, patterns) or (policy.allow_control_plane and key in CONTROL_PLANE_KEYS)


def check_node_selector(selector: Mapping[str, Any] | None, policy: AdmissionPolicy) -> list[str]:
    """Every ``nodeSelector`` key in the allowlist (the control-plane roles only with ``allow_control_plane``)."""
    out = []
    for key in selector or {}:
        if _key_allowed(key, policy.node_selector_keys, policy):
            continue
        rule = (
            "selects control-plane nodes (MLBENCH_ALLOW_CONTROL_PLANE: false)"
            if key in CONTROL_PLANE_KEYS
            else f"key is not allowed (MLBENCH_ALLOWED_NODE_SELECTOR_KEYS: {', '.join(policy.node_selector_keys)})"
        )
        out.append(f"spec.scheduling.nodeSelector: {key!r} {rule}")
    return out


def check_tolerations(tolerations: Iterable[Mapping[str, Any]] | None, policy: AdmissionPolicy) -> list[str]:
    """Every toleration's key in the allowlist; a toleration without a key (of every taint: cordoned and
    control-plane nodes included) only where the allowlist is ``*``."""
    out = []
    allowed = ", ".join(policy.toleration_keys)
    for i, tol in enumerate(tolerations or []):
        key = tol.get("key") or ""
        if _key_allowed(key, policy.toleration_keys, policy):
            continue
        if not key:
            what = "every taint, control-plane and cordoned nodes included"
        elif key in CONTROL_PLANE_KEYS:
            what = f"{key!r} (control-plane nodes; MLBENCH_ALLOW_CONTROL_PLANE: false)"
        else:
            what = repr(key)
        rule = f"not allowed (MLBENCH_ALLOWED_TOLERATION_KEYS: {allowed})"
        out.append(f"spec.scheduling.tolerations[{i}]: tolerates {what}, {rule}")
    return out


def check_scheduler(gang: Mapping[str, Any] | None, policy: AdmissionPolicy) -> list[str]:
    """A gang's own scheduler only if the admin lists it: a scheduler of the run's choosing could place its pods
    past the cluster's rules (unset: the operator's MLBENCH_GANG_SCHEDULER_NAME)."""
    return check_listed(
        (gang or {}).get("schedulerName"),
        policy.scheduler_names,
        "spec.scheduling.gang.schedulerName",
        "leave it unset for the operator's gang scheduler, or the admin lists it",
        "MLBENCH_ALLOWED_SCHEDULER_NAMES",
    )


def check_placement(scheduling: Mapping[str, Any] | None, policy: AdmissionPolicy) -> list[str]:
    """``nodeSelector`` keys, tolerations and a gang's scheduler only from the admin's allowlists."""
    scheduling = scheduling or {}
    return [
        *check_node_selector(scheduling.get("nodeSelector"), policy),
        *check_tolerations(scheduling.get("tolerations"), policy),
        *check_scheduler(scheduling.get("gang"), policy),
    ]


def check_volume(volume: Mapping[str, Any] | None, policy: AdmissionPolicy) -> list[str]:
    """``dataset.volume`` is a free-form Volume source: only the allowed types (never hostPath by default)."""
    if not volume:
        return []
    kinds = sorted(k for k in volume if k != "name")
    refused = [k for k in kinds if k not in policy.volume_types]
    if not refused:
        return []
    return [
        f"task dataset.volume: volume type {refused[0]!r} is not allowed "
        f"(MLBENCH_ALLOWED_VOLUME_TYPES: {', '.join(policy.volume_types)})"
    ]


def check_network(network: Mapping[str, Any] | None, policy: AdmissionPolicy) -> list[str]:
    """``spec.network`` puts an init container running as root with NET_ADMIN into every worker pod."""
    if not network or policy.allow_network_emulation:
        return []
    return [
        "spec.network: emulated network conditions need an init container running as root with NET_ADMIN in "
        "every worker (outside the restricted Pod Security profile); the operator's admin has not allowed them "
        "(MLBENCH_ALLOW_NETWORK_EMULATION=true)"
    ]


#: Where a run's own pod settings are; a task's are named ``BenchmarkTask '<name>' spec.pod``.
RUN_POD = "spec.pod"


def check_env(env: Iterable[Mapping[str, Any]] | None, policy: AdmissionPolicy, at: str = RUN_POD) -> list[str]:
    """Every ``spec.pod.env`` name matches the admin's patterns (NCCL_*, UCX_*... by default)."""
    return [
        f"{at}.env[{i}]: {var.get('name')!r} is not allowed (MLBENCH_ALLOWED_ENV: {_listed(policy.env_names)})"
        for i, var in enumerate(env or [])
        if not _matches(str(var.get("name", "")), policy.env_names)
    ]


def check_pod_keys(
    keys: Iterable[str] | None, field: str, patterns: tuple[str, ...], variable: str, at: str = RUN_POD
) -> list[str]:
    """Every annotation (or label) key of the worker pods matches the admin's patterns."""
    return [
        f"{at}.{field}: key {key!r} is not allowed ({variable}: {_listed(patterns)})"
        for key in keys or []
        if not _matches(key, patterns)
    ]


def check_extended_resources(
    resources: Mapping[str, Any] | None, policy: AdmissionPolicy, at: str = RUN_POD
) -> list[str]:
    """Extended resources besides nvidia.com/gpu only where the admin lists them (RDMA devices, EFA adapters)."""
    allowed = _listed(policy.extended_resources)
    return [
        f"{at}.extendedResources: {name!r} is not allowed (MLBENCH_ALLOWED_EXTENDED_RESOURCES: {allowed})"
        for name in resources or {}
        if name != GPU_RESOURCE and not _matches(name, policy.extended_resources)
    ]


def check_host_namespaces(pod: Mapping[str, Any], policy: AdmissionPolicy, at: str = RUN_POD) -> list[str]:
    """``hostNetwork`` and ``hostIPC`` share the node's namespaces (outside the baseline Pod Security level)."""
    out = []
    if pod.get("hostNetwork") and not policy.allow_host_network:
        out.append(f"{at}.hostNetwork: the node's network namespace is not allowed (MLBENCH_ALLOW_HOST_NETWORK: false)")
    if pod.get("hostIpc") and not policy.allow_host_ipc:
        out.append(f"{at}.hostIpc: the node's IPC namespace is not allowed (MLBENCH_ALLOW_HOST_IPC: false)")
    return out


def node_affinity_keys(affinity: Mapping[str, Any] | None, at: str = RUN_POD) -> list[tuple[str, str]]:
    """(field, key) of every node affinity requirement that selects nodes (operators In, Exists, Gt, Lt), in the
    required terms and the preferred ones; ``NotIn`` and ``DoesNotExist`` only narrow and are not listed."""
    node = (affinity or {}).get("nodeAffinity") or {}
    at = f"{at}.affinity.nodeAffinity"
    required = (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    terms = [
        (f"{at}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]", t)
        for i, t in enumerate(required)
    ]
    preferred = node.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    terms += [
        (f"{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference", (p or {}).get("preference"))
        for i, p in enumerate(preferred)
    ]
    return [
        (f"{field}.{kind}[{j}]", str(req.get("key", "")))
        for field, term in terms
        for kind in ("matchExpressions", "matchFields")
        for j, req in enumerate((term or {}).get(kind) or [])
        if req.get("operator") not in NARROWING_OPERATORS
    ]


def check_affinity(affinity: Mapping[str, Any] | None, policy: AdmissionPolicy, at: str = RUN_POD) -> list[str]:
    """Node affinity keys from the nodeSelector allowlist: an affinity selects nodes as a nodeSelector does."""
    out = []
    for field, key in node_affinity_keys(affinity, at):
        if _key_allowed(key, policy.node_selector_keys, policy):
            continue
        rule = (
            "selects control-plane nodes (MLBENCH_ALLOW_CONTROL_PLANE: false)"
            if key in CONTROL_PLANE_KEYS
            else f"key is not allowed (MLBENCH_ALLOWED_NODE_SELECTOR_KEYS: {', '.join(policy.node_selector_keys)})"
        )
        out.append(f"{field}: {key!r} {rule}")
    return out


def check_pod(pod: Mapping[str, Any] | None, policy: AdmissionPolicy, at: str = RUN_POD) -> list[str]:
    """``spec.pod`` (a run's, or a task's named by ``at``): each setting only as far as the admin allows it."""
    pod = pod or {}
    return [
        *check_env(pod.get("env"), policy, at),
        *check_pod_keys(
            pod.get("annotations"), "annotations", policy.pod_annotations, "MLBENCH_ALLOWED_POD_ANNOTATIONS", at
        ),
        *check_pod_keys(pod.get("labels"), "labels", policy.pod_labels, "MLBENCH_ALLOWED_POD_LABELS", at),
        *check_extended_resources(pod.get("extendedResources"), policy, at),
        *check_affinity(pod.get("affinity"), policy, at),
        *check_host_namespaces(pod, policy, at),
    ]


def violations(
    image: str,
    image_field: str,
    scheduling: Mapping[str, Any] | None,
    dataset_volume: Mapping[str, Any] | None,
    policy: AdmissionPolicy,
    *,
    network: Mapping[str, Any] | None = None,
    pod: Mapping[str, Any] | None = None,
) -> list[str]:
    """Every way the run breaks the policy, each naming its field (empty: admitted)."""
    return [
        *check_image(image, image_field, policy),
        *check_priority((scheduling or {}).get("priorityClassName"), policy),
        *check_placement(scheduling, policy),
        *check_volume(dataset_volume, policy),
        *check_network(network, policy),
        *check_pod(pod, policy),
    ]
