"""Pytest plugin: a real local Kubernetes API for tests marked ``cluster``.

Fixtures:
  kube_cluster (session)  brings the local cluster up once (or uses
                          ``$MLBENCH_TEST_KUBECONFIG``), installs the CRDs from
                          ``crds/bases`` and tears down only what it started.
  kubeconfig (session)    path to the admin kubeconfig.
  kubectl (session)       callable running kubectl against that cluster.
  kube_api (session)      ``kubernetes.client.ApiClient`` for that cluster.
  namespace (function)    a fresh namespace enforcing the ``restricted`` Pod Security Standard
                          (enforce, warn and audit), deleted afterwards; a test that needs another
                          level says so with ``@pytest.mark.pod_security(level, reason=...)``.
  real_node (session)     ``RealNodeInfo`` of the nodes that really run pods (the local
                          cluster's ``mlbench-node-0..``, or the nodes of an external
                          cluster that are not kwok's); skips with the reason if none.

``MLBENCH_KUBECTL`` overrides the kubectl binary (default: the one built by
``tests/cluster/build-k8s.sh``, or ``kubectl`` on PATH with an external
cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from tests.cluster.cluster import LocalCluster, kubectl_path
from tests.cluster.node import REAL_NODE_KEY, RealNodeInfo

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = Path(os.environ.get("MLBENCH_CRD_DIR", REPO_ROOT / "crds" / "bases"))


class Kubectl(Protocol):
    def __call__(
        self, *args: str, input: str | None = None, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]: ...


@dataclass(frozen=True)
class KubeCluster:
    """What the session fixture hands out."""

    kubeconfig: Path
    kubectl_bin: str
    started_here: bool
    crds: tuple[str, ...]
    #: the local cluster when the session runs on it (None with MLBENCH_TEST_KUBECONFIG)
    local: LocalCluster | None = None

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl; never raises on failure unless ``check`` (tests assert
        on returncode/stderr of the real server's answer)."""
        return subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )


#: The Pod Security Standard level of the test namespaces, as of the operator's (manifests/operator/namespace.yaml)
DEFAULT_POD_SECURITY = "restricted"
POD_SECURITY_LEVELS = ("restricted", "baseline", "privileged")
#: A pod (``RESTRICTED_POD_CONTEXT``) and container (``RESTRICTED_CONTAINER_CONTEXT``) securityContext that the
#: ``restricted`` level admits, for the tests' own pods (busybox has a world-writable /tmp; UID 65534 is nobody).
RESTRICTED_POD_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 65534,
    "runAsGroup": 65534,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER_CONTEXT: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_security_labels(level: str) -> dict[str, str]:
    """The namespace labels enforcing ``level`` (and warning and auditing on it), at the latest version."""
    if level not in POD_SECURITY_LEVELS:
        raise ValueError(f"Pod Security level {level!r}: one of {', '.join(POD_SECURITY_LEVELS)}")
    prefix = "pod-security.kubernetes.io"
    return {
        f"{prefix}/enforce": level,
        f"{prefix}/enforce-version": "latest",
        f"{prefix}/warn": level,
        f"{prefix}/audit": level,
    }


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs the local Kubernetes control plane (kube_cluster fixture)")
    config.addinivalue_line("markers", "realnode: needs a node that really runs pods (real_node fixture)")
    config.addinivalue_line(
        "markers",
        "pod_security(level, reason): the Pod Security level of the `namespace` fixture's namespace instead of "
        f"{DEFAULT_POD_SECURITY!r} (baseline or privileged); `reason` says why the test needs it",
    )


def _resolve_kubectl(external: bool) -> str:
    override = os.environ.get("MLBENCH_KUBECTL")
    if override:
        return override
    built = kubectl_path()
    if built.exists() or not external:
        return str(built)
    found = shutil.which("kubectl")
    if not found:
        raise RuntimeError("no kubectl: set MLBENCH_KUBECTL or run `make k8s-bins`")
    return found


def crd_files(crd_dir: Path = CRD_DIR) -> list[Path]:
    """YAML files in ``crd_dir`` holding CustomResourceDefinitions (skips the
    kustomization.yaml that sits next to them)."""
    out = []
    for f in sorted(crd_dir.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
        if docs and all(d.get("kind") == "CustomResourceDefinition" for d in docs):
            out.append(f)
    return out


def install_crds(cluster: KubeCluster, crd_dir: Path = CRD_DIR, timeout: float = 60) -> tuple[str, ...]:
    """Server-side apply every CRD in ``crd_dir`` and wait until Established."""
    files = crd_files(crd_dir)
    if not files:
        return ()
    names: list[str] = []
    for f in files:
        res = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f), "-o", "name")
        if res.returncode != 0:
            raise RuntimeError(f"installing CRD {f.name} failed:\n{res.stderr}")
        names += [n.strip() for n in res.stdout.splitlines() if n.strip()]
    res = cluster.kubectl(
        "wait", "--for=condition=Established", f"--timeout={int(timeout)}s", *names, timeout=timeout + 10
    )
    if res.returncode != 0:
        raise RuntimeError(f"CRDs not Established:\n{res.stderr}")
    return tuple(names)


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    external = os.environ.get("MLBENCH_TEST_KUBECONFIG")
    local: LocalCluster | None = None
    if external:
        kubeconfig = Path(external)
        started = False
    else:
        local = LocalCluster()
        started = local.up()
        kubeconfig = local.kubeconfig
    try:
        cluster = KubeCluster(kubeconfig, _resolve_kubectl(bool(external)), started, (), local)
        crds = install_crds(cluster)
        yield KubeCluster(kubeconfig, cluster.kubectl_bin, started, crds, local)
    finally:
        if local is not None and started:
            local.down()


def find_real_node(cluster: KubeCluster) -> RealNodeInfo | str:
    """The node tests may run real pods on, or why there is none.

    Local cluster: its state says.  External cluster: a node labelled
    ``mlbench.io/real-node=true`` (our local cluster reached via its kubeconfig),
    else any cluster with a node kwok does not simulate (kind, a cloud cluster).
    """
    if cluster.local is not None:
        node = cluster.local.real_node()
        return node if node is not None else f"the local cluster has no real node: {cluster.local.real_node_reason()}"
    res = cluster.kubectl("get", "nodes", "-o", "json")
    if res.returncode != 0:
        return f"cannot list nodes: {res.stderr.strip()}"
    nodes = json.loads(res.stdout)["items"]
    containerd = os.environ.get("MLBENCH_CONTAINERD_ADDRESS") or None
    sockets = tuple((os.environ.get("MLBENCH_CONTAINERD_ADDRESSES") or containerd or "").split())
    labelled = [
        n["metadata"]["name"] for n in nodes if (n["metadata"].get("labels") or {}).get(REAL_NODE_KEY) == "true"
    ]
    if labelled:
        return RealNodeInfo(
            name=labelled[0], containerd_address=containerd, names=tuple(labelled), containerd_addresses=sockets
        )
    real = [
        n["metadata"]["name"] for n in nodes if "kwok.x-k8s.io/node" not in (n["metadata"].get("annotations") or {})
    ]
    if not real:
        return "the cluster has only kwok (fake) nodes"
    return RealNodeInfo(
        name=None,
        containerd_address=containerd,
        node_selector={},
        tolerations=[],
        ip=None,
        names=tuple(real),
        containerd_addresses=sockets,
    )


@pytest.fixture(scope="session")
def real_node(kube_cluster: KubeCluster) -> RealNodeInfo:
    """A node that really runs pods, with the scheduling to reach it; skips if none."""
    found = find_real_node(kube_cluster)
    if isinstance(found, str):
        pytest.skip(f"no real node: {found}")
    return found


@pytest.fixture(scope="session")
def kubeconfig(kube_cluster: KubeCluster) -> Path:
    return kube_cluster.kubeconfig


@pytest.fixture(scope="session")
def kubectl(kube_cluster: KubeCluster) -> Kubectl:
    return kube_cluster.kubectl


@pytest.fixture(scope="session")
def kube_api(kube_cluster: KubeCluster) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` (imported lazily so collection works
    without the package)."""
    from kubernetes import config as k8s_config

    client = k8s_config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.2, what: str = "") -> Any:
    """Poll until ``predicate()`` is truthy; return its value or fail the test."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def create_namespace(cluster: KubeCluster, name: str | None = None, pod_security: str = DEFAULT_POD_SECURITY) -> str:
    """Create (or label) namespace ``name`` (default: a unique ``t-...``) enforcing ``pod_security`` and wait for its
    default ServiceAccount, so that pods are admitted; return its name. The caller deletes it."""
    name = name or f"t-{uuid.uuid4().hex[:10]}"
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": pod_security_labels(pod_security)},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=True)
    wait_for(
        lambda: cluster.kubectl("-n", name, "get", "serviceaccount", "default").returncode == 0,
        what=f"default ServiceAccount in {name}",
    )
    return name


def _pod_security_level(request: pytest.FixtureRequest) -> str:
    marker = request.node.get_closest_marker("pod_security")
    if marker is None:
        return DEFAULT_POD_SECURITY
    (level,) = marker.args
    if not str(marker.kwargs.get("reason", "")).strip():
        pytest.fail(f"@pytest.mark.pod_security({level!r}) needs reason=...: why the test needs more than restricted")
    return str(level)


@pytest.fixture
def namespace(kube_cluster: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique namespace enforcing the ``restricted`` Pod Security Standard (another level with
    ``@pytest.mark.pod_security(level, reason=...)``), with its default ServiceAccount, so pods are
    admitted; deleted after the test without waiting."""
    name = create_namespace(kube_cluster, pod_security=_pod_security_level(request))
    try:
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def port_probe(ip: str, ports: Sequence[int], tries: int = 10) -> str:
    """A busybox shell command that tries a TCP connection to each of ``ports`` at ``ip`` (in parallel, once a second
    for up to ``tries`` seconds: a policy enforcer syncs a new pod's address within a second or two) and prints
    ``open PORT`` or ``closed PORT`` for each (:func:`probe_results` reads them). A dropped SYN (policy) and a refused
    one read the same: the caller's control is a probe that must be ``open``."""
    one = (
        "r=closed; for i in $(seq 1 {tries}); do if nc -w 2 {ip} {port} </dev/null >/dev/null 2>&1; then r=open; "
        "break; fi; sleep 1; done; echo $r {port}"
    )
    jobs = " ".join(f"({one.format(tries=tries, ip=ip, port=port)}) &" for port in ports)
    return f"{jobs} wait"


def probe_results(log: str) -> dict[int, bool]:
    """``{port: open?}`` from the output of :func:`port_probe` (other lines ignored)."""
    rows = [line.split() for line in log.splitlines()]
    return {int(row[1]): row[0] == "open" for row in rows if len(row) == 2 and row[0] in ("open", "closed")}


def get_json(kube_cluster: KubeCluster, *args: str) -> Any:
    """``kubectl get ... -o json`` parsed; None if it does not exist."""
    res = kube_cluster.kubectl("get", *args, "-o", "json")
    if res.returncode != 0:
        if "NotFound" in res.stderr:
            return None
        raise RuntimeError(res.stderr)
    return json.loads(res.stdout)
