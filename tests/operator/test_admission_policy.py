"""manifests/policy: the operator's admission policy (policy.py) as a ValidatingAdmissionPolicy, checked against
the real kube-apiserver of the test cluster, and against policy.py itself.

The shipped policy's limits are its first five variables, the operator's defaults; an admin widens them with a
patch of their expressions, as ``policy_with`` does here from the operator's own settings (the MLBENCH_ALLOWED_* /
MLBENCH_ALLOW_* environment). For every settings set the test applies such a copy under a name of this session's
own, bound with an ``objectSelector`` on a label only this module's objects carry: other tests (and other
sessions on the same cluster) are never judged by it, cluster-scoped BenchmarkTasks included. The cases are sent
as server-side dry runs (full admission, nothing stored), and each is also handed to the operator's own
admission (``admission.admit`` with ``AdmissionPolicy.from_env`` of the same settings): the two must agree on
accept/refuse, and the API server's message must name the field.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_operator.conditions import Reason
from mlbench_operator.policy import (
    DEFAULT_ENV_NAMES,
    DEFAULT_IMAGES,
    DEFAULT_NODE_SELECTOR_KEYS,
    DEFAULT_POD_ANNOTATIONS,
    DEFAULT_TOLERATION_KEYS,
    DEFAULT_VOLUME_TYPES,
    AdmissionPolicy,
)
from mlbench_operator.run import admission
from tests.cluster.plugin import KubeCluster, create_namespace, wait_for
from tests.operator import helpers as h

REPO = Path(__file__).resolve().parents[2]
POLICY_DIR = REPO / "manifests" / "policy"
#: the label that makes a test binding judge an object (value: this session's id and the settings set)
TEST_LABEL = "mlbench.io/admission-policy-test"
GROUP_VERSION = "mlbench.io/v1alpha1"
#: The policy's first fourteen variables, in order, and the operator setting each one mirrors.
SETTINGS = {
    "allowedImages": "MLBENCH_ALLOWED_IMAGES",
    "allowedPriorityClasses": "MLBENCH_ALLOWED_PRIORITY_CLASSES",
    "allowControlPlane": "MLBENCH_ALLOW_CONTROL_PLANE",
    "allowedVolumeTypes": "MLBENCH_ALLOWED_VOLUME_TYPES",
    "allowNetworkEmulation": "MLBENCH_ALLOW_NETWORK_EMULATION",
    "allowedNodeSelectorKeys": "MLBENCH_ALLOWED_NODE_SELECTOR_KEYS",
    "allowedTolerationKeys": "MLBENCH_ALLOWED_TOLERATION_KEYS",
    "allowedEnv": "MLBENCH_ALLOWED_ENV",
    "allowedPodAnnotations": "MLBENCH_ALLOWED_POD_ANNOTATIONS",
    "allowedPodLabels": "MLBENCH_ALLOWED_POD_LABELS",
    "allowedExtendedResources": "MLBENCH_ALLOWED_EXTENDED_RESOURCES",
    "allowHostNetwork": "MLBENCH_ALLOW_HOST_NETWORK",
    "allowHostIpc": "MLBENCH_ALLOW_HOST_IPC",
    "allowedSchedulerNames": "MLBENCH_ALLOWED_SCHEDULER_NAMES",
}
Obj = dict[str, Any]


def shipped() -> dict[str, Obj]:
    """The objects of manifests/policy by kind."""
    out: dict[str, Obj] = {}
    for f in ("policy.yaml", "binding.yaml"):
        for doc in yaml.safe_load_all((POLICY_DIR / f).read_text()):
            if doc:
                assert doc["kind"] not in out, doc["kind"]
                out[doc["kind"]] = doc
    return out


def cel_setting(key: str, raw: str) -> str | None:
    """The expression an admin gives the policy variable for operator setting ``key`` = ``raw`` (comma-separated
    list, or true/false); None where the operator keeps its default (unset or empty)."""
    if not raw.strip():
        return None
    if key.startswith("MLBENCH_ALLOW_"):
        return "true" if raw.strip().lower() == "true" else "false"
    items = [x.strip() for x in raw.split(",") if x.strip()]
    return "[" + ", ".join(json.dumps(x) for x in items) + "]"  # a JSON string is a CEL string literal


def policy_with(settings: Mapping[str, str]) -> Obj:
    """The shipped policy widened (or narrowed) as the operator is by the same environment ``settings``."""
    policy = copy.deepcopy(shipped()["ValidatingAdmissionPolicy"])
    variables = policy["spec"]["variables"]
    for i, (name, key) in enumerate(SETTINGS.items()):
        assert variables[i]["name"] == name
        expression = cel_setting(key, settings.get(key, ""))
        if expression is not None:
            variables[i]["expression"] = expression
    return policy


# -- no cluster needed ------------------------------------------------------------------------------------------
def test_the_limits_are_the_operators_defaults() -> None:
    variables = shipped()["ValidatingAdmissionPolicy"]["spec"]["variables"]
    assert [v["name"] for v in variables[: len(SETTINGS)]] == list(SETTINGS)  # the documented patches' indexes
    defaults = {
        "MLBENCH_ALLOWED_IMAGES": ",".join(DEFAULT_IMAGES),
        "MLBENCH_ALLOWED_VOLUME_TYPES": ",".join(DEFAULT_VOLUME_TYPES),
        "MLBENCH_ALLOW_CONTROL_PLANE": "false",
        "MLBENCH_ALLOW_NETWORK_EMULATION": "false",
        "MLBENCH_ALLOWED_NODE_SELECTOR_KEYS": ",".join(DEFAULT_NODE_SELECTOR_KEYS),
        "MLBENCH_ALLOWED_TOLERATION_KEYS": ",".join(DEFAULT_TOLERATION_KEYS),
        "MLBENCH_ALLOWED_ENV": ",".join(DEFAULT_ENV_NAMES),
        "MLBENCH_ALLOWED_POD_ANNOTATIONS": ",".join(DEFAULT_POD_ANNOTATIONS),
        "MLBENCH_ALLOW_HOST_NETWORK": "false",
        "MLBENCH_ALLOW_HOST_IPC": "false",
    }
    assert AdmissionPolicy.from_env(defaults) == AdmissionPolicy()
    # the shipped expressions say exactly that (the priority classes: [], none, as the unset variable)
    rendered = policy_with(defaults)["spec"]["variables"]
    for shipped_var, same in zip(variables[: len(SETTINGS)], rendered[: len(SETTINGS)], strict=True):
        assert yaml.safe_load(shipped_var["expression"].replace("'", '"')) == yaml.safe_load(same["expression"])
    assert variables[1]["expression"] == "[]"
    assert variables[9]["expression"] == variables[10]["expression"] == "[]"  # no pod labels, no extended resources
    assert variables[13]["expression"] == "[]"  # a gang's scheduler: only the operator's (unset)


def test_the_binding_is_cluster_wide_and_denies() -> None:
    objs = shipped()
    policy, binding = objs["ValidatingAdmissionPolicy"], objs["ValidatingAdmissionPolicyBinding"]
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert "paramKind" not in policy["spec"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["resources"]) == {"benchmarkruns", "benchmarksweeps", "benchmarktasks"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace, and the cluster-scoped tasks


# -- the case table -----------------------------------------------------------------------------------------------
#: Settings sets: the operator's environment, and the policy widened alike (``policy_with``).
SETTINGS_SETS: dict[str, dict[str, str]] = {
    "defaults": {},
    "images": {"MLBENCH_ALLOWED_IMAGES": "registry.example.com/team/*, mlbench/mlbench-runner:*"},
    "any-image": {"MLBENCH_ALLOWED_IMAGES": "*"},
    "priorities": {"MLBENCH_ALLOWED_PRIORITY_CLASSES": "batch-*,system-cluster-critical"},
    "control-plane": {"MLBENCH_ALLOW_CONTROL_PLANE": "true"},
    "volumes": {"MLBENCH_ALLOWED_VOLUME_TYPES": "persistentVolumeClaim,hostPath"},
    "network": {"MLBENCH_ALLOW_NETWORK_EMULATION": "true"},
    "placement": {
        "MLBENCH_ALLOWED_NODE_SELECTOR_KEYS": "dedicated",
        "MLBENCH_ALLOWED_TOLERATION_KEYS": "dedicated,example.com/*",
    },
    "any-toleration": {"MLBENCH_ALLOWED_TOLERATION_KEYS": "*"},
    "schedulers": {"MLBENCH_ALLOWED_SCHEDULER_NAMES": "volcano,team-*"},
    "empty": {key: "" for key in ("MLBENCH_ALLOWED_IMAGES", "MLBENCH_ALLOWED_VOLUME_TYPES")},
    "gpu-cluster": {
        "MLBENCH_ALLOWED_ENV": "NCCL_*,OMPI_MCA_btl_*",
        "MLBENCH_ALLOWED_POD_LABELS": "team",
        "MLBENCH_ALLOWED_EXTENDED_RESOURCES": "rdma/*",
        "MLBENCH_ALLOW_HOST_NETWORK": "true",
        "MLBENCH_ALLOWED_NODE_SELECTOR_KEYS": "pool",
    },
}


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # BenchmarkRun, BenchmarkSweep, BenchmarkTask
    spec: Obj  # a run spec (for a sweep: its template), or a task spec
    admitted: bool
    #: what the API server's message must contain (the field) when refused
    needles: tuple[str, ...] = ()
    settings: str = "defaults"


RUNNER = "localhost/mlbench/mlbench-runner:0.1.0"
CP = "node-role.kubernetes.io/control-plane"


def run_spec(**spec: Any) -> Obj:
    return {"taskRef": {"name": h.TASK_NAME}, "workers": 2, **spec}


def task_spec(image: str = RUNNER, volume: Obj | None = None, pod: Obj | None = None) -> Obj:
    spec = copy.deepcopy(h.task()["spec"])
    spec["runner"]["image"] = image
    if volume is not None:
        spec["dataset"]["volume"] = volume
    if pod is not None:
        spec["pod"] = pod
    return spec


def sched(**kw: Any) -> Obj:
    return {"scheduling": kw}


def pod(**kw: Any) -> Obj:
    """``spec.pod`` (with the placement hostNetwork needs: the policy ignores it)."""
    return {"pod": kw, "scheduling": {"placement": "OneWorkerPerNode"}}


def node_affinity(key: str, operator: str = "In") -> Obj:
    values = {"values": ["a"]} if operator in ("In", "NotIn") else {}
    term = {"matchExpressions": [{"key": key, "operator": operator, **values}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def run(id: str, admitted: bool, *needles: str, settings: str = "defaults", **spec: Any) -> Case:
    return Case(id, "BenchmarkRun", run_spec(**spec), admitted, needles, settings)


def sweep(id: str, admitted: bool, *needles: str, settings: str = "defaults", **spec: Any) -> Case:
    return Case(id, "BenchmarkSweep", run_spec(**spec), admitted, needles, settings)


def task(id: str, admitted: bool, *needles: str, settings: str = "defaults", **kw: Any) -> Case:
    return Case(id, "BenchmarkTask", task_spec(**kw), admitted, needles, settings)


CASES = [
    # the defaults: the project's runner, no priority class, well-known node labels, the GPU taint, no hostPath
    run(
        "run-compliant",
        True,
        image=RUNNER,
        **sched(
            nodeSelector={"nvidia.com/gpu.present": "true"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        ),
    ),
    run("run-task-image", True),  # no spec.image: the task's runner.image counts (checked on the task)
    run("run-digest", True, image="localhost/mlbench/mlbench-runner@sha256:" + "a" * 64),
    run("run-index-docker-io", False, "spec.image", image="index.docker.io/mlbench/mlbench-runner:1"),
    run("run-image-prefix", False, "spec.image", image="localhost/mlbench/mlbench-runner-evil:1"),
    run("run-image-registry", False, "spec.image", image="evil.example.com/mlbench/mlbench-runner:0.1.0"),
    run("run-image-library", False, "spec.image", image="busybox"),
    run("run-image-docker-hub", False, "spec.image", image="mlbench/mlbench-runner:1"),  # not the default repository
    run(
        "run-priority-system",
        False,
        "spec.scheduling.priorityClassName",
        **sched(priorityClassName="system-node-critical"),
    ),
    run("run-selector-cp", False, "spec.scheduling.nodeSelector", **sched(nodeSelector={CP: ""})),
    run(
        "run-selector-master",
        False,
        "spec.scheduling.nodeSelector",
        **sched(nodeSelector={"node-role.kubernetes.io/master": ""}),
    ),
    run("run-tolerate-all", False, "spec.scheduling.tolerations", **sched(tolerations=[{"operator": "Exists"}])),
    run(
        "run-tolerate-all-empty-key",
        False,
        "spec.scheduling.tolerations",
        **sched(tolerations=[{"key": "", "operator": "Exists"}]),
    ),
    run(
        "run-tolerate-cp",
        False,
        "spec.scheduling.tolerations",
        **sched(tolerations=[{"key": CP, "operator": "Exists", "effect": "NoSchedule"}]),
    ),
    run(
        "run-tolerate-keyless-equal",
        False,
        "spec.scheduling.tolerations",
        **sched(tolerations=[{"operator": "Equal", "value": "x"}]),
    ),
    run("run-priority-unlisted", False, "spec.scheduling.priorityClassName", **sched(priorityClassName="batch-low")),
    run("run-selector-unlisted", False, "spec.scheduling.nodeSelector", **sched(nodeSelector={"dedicated": "a"})),
    run(
        "run-tolerate-cordoned",
        False,
        "spec.scheduling.tolerations",
        **sched(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]),
    ),
    run("run-network", False, "spec.network", network={"latencyMs": 5}),
    run(
        "run-everything-wrong",
        False,
        "spec.image",
        "spec.scheduling.priorityClassName",
        "spec.scheduling.nodeSelector",
        "spec.scheduling.tolerations",
        "spec.network",
        image="busybox",
        network={"bandwidthMbit": 100},
        **sched(
            priorityClassName="system-cluster-critical", nodeSelector={CP: ""}, tolerations=[{"operator": "Exists"}]
        ),
    ),
    # a sweep's template becomes its runs
    sweep("sweep-compliant", True, image=RUNNER, **sched(nodeSelector={"kubernetes.io/arch": "amd64"})),
    sweep("sweep-selector", False, "spec.template.scheduling.nodeSelector", **sched(nodeSelector={"x": "y"})),
    sweep("sweep-image", False, "spec.template.image", image="busybox:1.36"),
    sweep("sweep-priority", False, "spec.template.scheduling.priorityClassName", **sched(priorityClassName="system-x")),
    sweep(
        "sweep-tolerate-all",
        False,
        "spec.template.scheduling.tolerations",
        **sched(tolerations=[{"operator": "Exists"}]),
    ),
    sweep("sweep-network", False, "spec.template.network", network={"latencyMs": 1}),
    # a task: its runner.image and dataset.volume
    task("task-compliant", True),
    task("task-pvc", True, volume={"persistentVolumeClaim": {"claimName": "data", "readOnly": True}}),
    task("task-nfs", True, volume={"nfs": {"server": "nfs.example.com", "path": "/x"}}),
    task("task-image", False, "spec.runner.image", image="evil.example.com/runner:1"),
    task("task-hostpath", False, "spec.dataset.volume", volume={"hostPath": {"path": "/"}}),
    task("task-iscsi", False, "spec.dataset.volume", volume={"iscsi": {"targetPortal": "x", "iqn": "y", "lun": 0}}),
    # widened by the admin
    run("images-team", True, image="registry.example.com/team/runner:2", settings="images"),
    run("images-runner-short", True, image="docker.io/mlbench/mlbench-runner:2", settings="images"),
    run("images-other-team", False, "spec.image", image="registry.example.com/other/runner:2", settings="images"),
    run(
        "images-digest-not-listed",
        False,
        "spec.image",
        image="mlbench/mlbench-runner@sha256:" + "b" * 64,
        settings="images",
    ),
    task("images-task", True, image="registry.example.com/team/runner:2", settings="images"),
    run("any-image", True, image="busybox", settings="any-image"),
    run(
        "any-image-still-priority",
        False,
        "spec.scheduling.priorityClassName",
        settings="any-image",
        image="busybox",
        **sched(priorityClassName="system-node-critical"),
    ),
    run("priorities-listed", True, settings="priorities", **sched(priorityClassName="batch-low")),
    run("priorities-listed-system", True, settings="priorities", **sched(priorityClassName="system-cluster-critical")),
    run(
        "priorities-unlisted",
        False,
        "spec.scheduling.priorityClassName",
        settings="priorities",
        **sched(priorityClassName="interactive"),
    ),
    run(
        "priorities-unlisted-system",
        False,
        "spec.scheduling.priorityClassName",
        settings="priorities",
        **sched(priorityClassName="system-node-critical"),
    ),
    run(
        "control-plane",
        True,
        settings="control-plane",
        **sched(nodeSelector={CP: ""}, tolerations=[{"key": CP, "operator": "Exists"}]),
    ),
    run(
        "control-plane-not-every-taint",
        False,
        "spec.scheduling.tolerations",
        settings="control-plane",
        **sched(tolerations=[{"operator": "Exists"}]),
    ),
    run(
        "placement-listed",
        True,
        settings="placement",
        **sched(nodeSelector={"dedicated": "a"}, tolerations=[{"key": "example.com/team", "operator": "Exists"}]),
    ),
    run(
        "placement-default-key-dropped",
        False,
        "spec.scheduling.nodeSelector",
        settings="placement",
        **sched(nodeSelector={"kubernetes.io/arch": "amd64"}),
    ),
    run(
        "placement-gpu-taint-dropped",
        False,
        "spec.scheduling.tolerations",
        settings="placement",
        **sched(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]),
    ),
    run("any-toleration", True, settings="any-toleration", **sched(tolerations=[{"operator": "Exists"}])),
    # a gang's own scheduler: one of the run author's choosing could ignore taints and cordons
    run("gang-operators-scheduler", True, **sched(gang={"scheduleTimeoutSeconds": 60})),
    run("gang-scheduler", False, "spec.scheduling.gang.schedulerName", **sched(gang={"schedulerName": "mine"})),
    sweep(
        "gang-sweep-scheduler",
        False,
        "spec.template.scheduling.gang.schedulerName",
        **sched(gang={"schedulerName": "mine"}),
    ),
    run("gang-scheduler-listed", True, settings="schedulers", **sched(gang={"schedulerName": "team-a"})),
    run(
        "gang-scheduler-unlisted",
        False,
        "spec.scheduling.gang.schedulerName",
        settings="schedulers",
        **sched(gang={"schedulerName": "default-scheduler"}),
    ),
    task("volumes-hostpath", True, settings="volumes", volume={"hostPath": {"path": "/srv/data"}}),
    task(
        "volumes-nfs-unlisted",
        False,
        "spec.dataset.volume",
        settings="volumes",
        volume={"nfs": {"server": "s", "path": "/"}},
    ),
    run("network", True, settings="network", network={"latencyMs": 5}),
    sweep("network-sweep", True, settings="network", network={"latencyMs": 5}),
    # spec.pod (GPU clusters): NCCL's variables and Multus by default; privilege-widening settings by the admin only
    run(
        "pod-compliant",
        True,
        **pod(
            env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "UCX_TLS", "value": "rc"}],
            annotations={"k8s.v1.cni.cncf.io/networks": "rdma-net"},
            affinity=node_affinity("topology.kubernetes.io/zone"),
            topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}],
        ),
    ),
    run("pod-affinity-narrowing", True, **pod(affinity=node_affinity(CP, "DoesNotExist"))),
    run("pod-env", False, "spec.pod.env", **pod(env=[{"name": "LD_PRELOAD", "value": "/data/x.so"}])),
    run("pod-env-ompi", False, "spec.pod.env", **pod(env=[{"name": "OMPI_MCA_plm_rsh_agent", "value": "sh"}])),
    run("pod-annotation", False, "spec.pod.annotations", **pod(annotations={"sidecar.istio.io/inject": "true"})),
    run("pod-label", False, "spec.pod.labels", **pod(labels={"app": "web"})),
    run("pod-rdma", False, "spec.pod.extendedResources", **pod(extendedResources={"rdma/hca_shared_devices_a": 1})),
    run("pod-affinity", False, "spec.pod.affinity.nodeAffinity", **pod(affinity=node_affinity("pool"))),
    run("pod-affinity-cp", False, "spec.pod.affinity.nodeAffinity", **pod(affinity=node_affinity(CP, "Exists"))),
    run("pod-host-network", False, "spec.pod.hostNetwork", **pod(hostNetwork=True)),
    run("pod-host-ipc", False, "spec.pod.hostIpc", **pod(hostIpc=True)),
    sweep("pod-sweep-host-network", False, "spec.template.pod.hostNetwork", **pod(hostNetwork=True)),
    run(
        "gpu-cluster",
        True,
        settings="gpu-cluster",
        **pod(
            env=[{"name": "NCCL_IB_HCA", "value": "mlx5"}, {"name": "OMPI_MCA_btl_tcp_if_include", "value": "net1"}],
            labels={"team": "vision"},
            extendedResources={"rdma/hca_shared_devices_a": 1},
            affinity=node_affinity("pool"),
            hostNetwork=True,
        ),
    ),
    run("gpu-cluster-env-replaced", False, "spec.pod.env", settings="gpu-cluster", **pod(env=[{"name": "UCX_TLS"}])),
    run("gpu-cluster-ipc", False, "spec.pod.hostIpc", settings="gpu-cluster", **pod(hostIpc=True)),
    run(
        "gpu-cluster-efa",
        False,
        "spec.pod.extendedResources",
        settings="gpu-cluster",
        **pod(extendedResources={"vpc.amazonaws.com/efa": 4}),
    ),
    # empty settings keep the defaults (the operator: as if unset; the policy: not patched)
    run("empty-image", False, "spec.image", image="busybox", settings="empty"),
    task("empty-volume", False, "spec.dataset.volume", settings="empty", volume={"hostPath": {"path": "/"}}),
    # a task's pod settings: checked as a run's (the operator names the task, the API server the task's field)
    task("task-pod-nccl", True, pod={"env": [{"name": "NCCL_ALGO", "value": "Ring"}]}),
    task("task-pod-env", False, "spec.pod.env", pod={"env": [{"name": "LD_PRELOAD", "value": "x"}]}),
    task("task-pod-rdma", False, "spec.pod.extendedResources", pod={"extendedResources": {"rdma/hca": 1}}),
    task("task-pod-ipc", False, "spec.pod.hostIpc", pod={"hostIpc": True}),
]


def operator_verdict(case: Case, settings: dict[str, str]) -> tuple[bool, str]:
    """What the operator's own admission says: a run of the case's spec (a sweep's runs are its template), or a
    run of the case's task."""
    policy = AdmissionPolicy.from_env(settings)
    if case.kind == "BenchmarkTask":
        result = admission.admit(h.run(), {"spec": case.spec}, policy=policy)
    else:
        result = admission.admit({**h.run(), "spec": case.spec}, h.task(), policy=policy)
    if isinstance(result, admission.Rejection):
        assert result.reason == Reason.POLICY_VIOLATION, result  # the case is about the policy, nothing else
        return False, result.message
    return True, ""


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_case_table_matches_the_operator(case: Case) -> None:
    """Without a cluster: the table's expectations are the operator's (the cluster test then holds the VAP to it)."""
    admitted, message = operator_verdict(case, SETTINGS_SETS[case.settings])
    assert admitted is case.admitted, message


# -- against the API server ---------------------------------------------------------------------------------------
class Vap:
    """This session's copies of the shipped policy, one per settings set, each bound to the objects labelled for it."""

    def __init__(self, cluster: KubeCluster, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.id = uuid.uuid4().hex[:8]
        self.names: list[str] = []

    def label(self, settings: str) -> str:
        return f"{self.id}-{settings}"

    def name(self, settings: str) -> str:
        return f"mlbench-admission-policy-test-{self.id}-{settings}"

    def install(self) -> None:
        for name, settings in SETTINGS_SETS.items():
            policy = policy_with(settings)
            policy["metadata"]["name"] = self.name(name)
            binding = copy.deepcopy(shipped()["ValidatingAdmissionPolicyBinding"])
            binding["metadata"]["name"] = self.name(name)
            binding["spec"]["policyName"] = self.name(name)
            binding["spec"]["matchResources"] = {"objectSelector": {"matchLabels": {TEST_LABEL: self.label(name)}}}
            self.names.append(self.name(name))
            self.apply(policy)
            self.apply(binding)
        for name in SETTINGS_SETS:
            self.wait_enforced(name)

    def wait_enforced(self, settings: str) -> None:
        """The API server takes a moment to enforce a new policy and binding (until then it admits): poll with a
        probe that every settings set refuses (an image, a priority class and spec.network none allows together)."""
        spec = run_spec(image="probe.invalid/probe:1", network={"latencyMs": 1}, **sched(priorityClassName="system-x"))
        probe = Case("probe", "BenchmarkRun", spec, False, (), settings)
        wait_for(
            lambda: not self.admit(probe)[0],
            timeout=60,
            interval=0.5,
            what=f"policy {self.name(settings)} to be enforced",
        )

    def apply(self, obj: Obj) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(obj), check=True)

    def body(self, case: Case) -> Obj:
        meta: Obj = {"name": f"vap-{case.id}", "labels": {TEST_LABEL: self.label(case.settings)}}
        if case.kind == "BenchmarkTask":
            return {"apiVersion": GROUP_VERSION, "kind": case.kind, "metadata": meta, "spec": case.spec}
        meta["namespace"] = self.ns
        spec = {"template": case.spec} if case.kind == "BenchmarkSweep" else case.spec
        return {"apiVersion": GROUP_VERSION, "kind": case.kind, "metadata": meta, "spec": spec}

    def admit(self, case: Case) -> tuple[bool, str]:
        """(admitted, the API server's refusal) of a server-side dry run: full admission, nothing stored."""
        body = json.dumps(self.body(case))
        res = self.cluster.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", input=body)
        if res.returncode == 0:
            return True, ""
        assert f"ValidatingAdmissionPolicy '{self.name(case.settings)}'" in res.stderr, res.stderr  # no other refusal
        return False, res.stderr

    def remove(self) -> None:
        for name in self.names:
            self.cluster.kubectl("delete", "validatingadmissionpolicybinding", name, "--ignore-not-found")
            self.cluster.kubectl("delete", "validatingadmissionpolicy", name, "--ignore-not-found")


@pytest.fixture(scope="module")
def vap(kube_cluster: KubeCluster) -> Iterator[Vap]:
    namespace = create_namespace(kube_cluster)
    policy = Vap(kube_cluster, namespace)
    try:
        policy.install()
        yield policy
    finally:
        policy.remove()
        kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")


@pytest.mark.cluster
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_api_server_agrees_with_the_operator(vap: Vap, case: Case) -> None:
    """The differential test: the real VAP and the operator's check say the same of every case."""
    admitted, refusal = vap.admit(case)
    expected, _ = operator_verdict(case, SETTINGS_SETS[case.settings])
    assert admitted is expected is case.admitted, refusal
    for needle in case.needles:
        assert f"{needle}: " in refusal, refusal
    if not admitted:
        assert "(MLBENCH_ALLOW" in refusal, refusal  # and the setting that widens it


@pytest.mark.cluster
def test_every_shipped_task_run_and_sweep_passes_the_default_policy(vap: Vap) -> None:
    files = sorted((REPO / "manifests" / "catalog").glob("*.yaml")) + sorted(
        (REPO / "manifests" / "examples").glob("*.yaml")
    )
    seen = set()
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc or doc.get("kind") not in ("BenchmarkTask", "BenchmarkRun", "BenchmarkSweep"):
                continue
            spec = doc["spec"]["template"] if doc["kind"] == "BenchmarkSweep" else doc["spec"]
            case = Case(doc["metadata"]["name"], doc["kind"], spec, True)
            admitted, refusal = vap.admit(case)
            assert admitted, f"{f.relative_to(REPO)}: {refusal}"
            seen.add(doc["kind"])
    assert seen == {"BenchmarkTask", "BenchmarkRun", "BenchmarkSweep"}


@pytest.mark.cluster
def test_a_refused_apply_stores_nothing_and_spec_free_updates_pass(vap: Vap) -> None:
    """What GitOps sees: ``kubectl apply`` fails at once and nothing is stored. An object created before the policy
    judged it (here: without the label) can still get labels and finalizers (the operator's writes), while a change
    of its spec is judged."""
    bad = Case("stored", "BenchmarkRun", run_spec(image="busybox"), False)
    body = vap.body(bad)
    res = vap.cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    assert res.returncode != 0
    assert "spec.image: image busybox is not allowed" in res.stderr
    assert "NotFound" in vap.cluster.kubectl("-n", vap.ns, "get", "benchmarkrun", "vap-stored").stderr

    unjudged = copy.deepcopy(body)
    del unjudged["metadata"]["labels"][TEST_LABEL]
    vap.cluster.kubectl("apply", "-f", "-", input=json.dumps(unjudged), check=True)
    try:
        patch = {"metadata": {"labels": {TEST_LABEL: vap.label("defaults")}, "finalizers": ["mlbench.io/test"]}}
        patched = vap.cluster.kubectl(
            "-n", vap.ns, "patch", "benchmarkrun", "vap-stored", "--type=merge", "-p", json.dumps(patch)
        )
        assert patched.returncode == 0, patched.stderr  # judged now, but the spec did not change
        spec_patch = {"spec": {"runPolicy": {"activeDeadlineSeconds": 60}}}  # the one mutable part of a run's spec
        refused = vap.cluster.kubectl(
            "-n", vap.ns, "patch", "benchmarkrun", "vap-stored", "--type=merge", "-p", json.dumps(spec_patch)
        )
        assert refused.returncode != 0
        assert "spec.image: image busybox is not allowed" in refused.stderr
    finally:
        unstuck = {"metadata": {"finalizers": None}}
        vap.cluster.kubectl(
            "-n", vap.ns, "patch", "benchmarkrun", "vap-stored", "--type=merge", "-p", json.dumps(unstuck)
        )
        vap.cluster.kubectl("-n", vap.ns, "delete", "benchmarkrun", "vap-stored", "--wait=false", "--ignore-not-found")
