"""End-to-end fixtures: built images, the operator installed as a user installs it, real pods.

Everything here goes through what a user has: ``make images`` (hack/images.sh), ``helm install``
of charts/mlbench with a real helm as docs/install.md says (tests/e2e/deploy: values for the test
cluster's scheduling, and a post-renderer for the operator settings no value expresses), uninstalled
at the session's end (runs first) with nothing of the release left, a
namespace that enforces the ``restricted`` Pod Security Standard, and the dataset mechanism of
the operator (a task whose ``dataset.source`` points at an HTTP server inside the cluster that
serves ``../shared/datasets/cifar10-jpeg.tar.gz``; nothing is prepared on a volume by hand).

On the local test cluster the pods run on its real node (kubelet + containerd). With
``MLBENCH_TEST_KUBECONFIG`` the same tests run against any real cluster whose nodes can run
the images ``localhost/mlbench/mlbench-{operator,runner}:<version>`` (push or side-load them first;
set ``MLBENCH_E2E_BUILD_IMAGES=0`` to skip the local build).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.helm import CHART, Helm, build
from tests.cluster.node import RealNodeInfo
from tests.cluster.plugin import KubeCluster, create_namespace

REPO = Path(__file__).resolve().parents[2]
DEPLOY = Path(__file__).resolve().parent / "deploy"
#: test images of the e2e task (its accuracy is measured on these)
TEST_SUBSET = 512
DATASET = REPO.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"
BUSYBOX = "docker.io/mlbench/busybox:test"
E2E_LABEL = {"mlbench.io/e2e": "true"}
SESSION = uuid.uuid4().hex[:6]
RELEASE = "mlbench"
OPERATOR_NAMESPACE = "mlbench-system"
POST_RENDER = Path(__file__).resolve().parent / "post_render.py"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class E2E:
    """One e2e namespace on a cluster with the operator installed."""

    cluster: KubeCluster
    namespace: str
    scheduling: dict[str, Any]
    containerd_address: str | None
    dataset_url: str
    dataset_sha256: str
    #: the real nodes' names (where the runs' pods may go) and their containerd sockets, in the same order
    real_nodes: tuple[str, ...] = ()
    containerd_addresses: tuple[str, ...] = ()
    tasks: list[str] = field(default_factory=list)
    #: the Helm release that installed the operator (None: installed otherwise)
    release: Release | None = None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, input=input, check=check)

    def apply(self, body: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))

    def task(self, name: str) -> str:
        """A cluster-scoped open-division task: the smoke recipe, shortened, with a sourced dataset."""
        smoke = yaml.safe_load((REPO / "manifests/catalog/cifar10-resnet20-smoke.yaml").read_text())
        spec = smoke["spec"]
        spec["description"] = "e2e test task (NOT a result): the smoke recipe on 1024 JPEG CIFAR-10 images"
        spec["dataset"].update(
            trainSubset=1024,
            testSubset=TEST_SUBSET,
            source={"url": self.dataset_url, "sha256": self.dataset_sha256},
        )
        spec["training"]["maxEpochs"] = 3
        spec["training"]["learningRate"]["milestones"] = [2]
        spec["goal"].update(target=0.15, lightTarget=0.12)
        full = f"e2e-{SESSION}-{name}"
        self.apply(
            {
                "apiVersion": "mlbench.io/v1alpha1",
                "kind": "BenchmarkTask",
                "metadata": {"name": full, "labels": E2E_LABEL},
                "spec": spec,
            }
        )
        self.tasks.append(full)
        return full

    def unreachable_goal(self, task: str) -> str:
        """``task`` with a goal it never reaches, so that a run trains every epoch (the e2e task reaches its own in
        the first): for tests that need the run still training a while, or a checkpoint after the first epoch."""
        body = json.loads(self.kubectl("get", "benchmarktask", task, "-o", "json").stdout)
        spec = body["spec"]
        spec["goal"].update(target=0.99, lightTarget=0.98)
        name = f"{task}-long"
        meta = {"name": name, "labels": E2E_LABEL}
        self.apply({"apiVersion": body["apiVersion"], "kind": "BenchmarkTask", "metadata": meta, "spec": spec})
        if name not in self.tasks:
            self.tasks.append(name)
        return name

    def run(self, name: str, task: str, **spec: Any) -> str:
        body = {
            "apiVersion": "mlbench.io/v1alpha1",
            "kind": "BenchmarkRun",
            "metadata": {"name": name, "namespace": self.namespace, "labels": E2E_LABEL},
            "spec": {
                "taskRef": {"name": task},
                "workers": 2,
                # two workers and the launcher (100m) fit the test node's 2 CPUs
                "resources": {"cpu": "850m", "memory": "2Gi"},
                "scheduling": self.scheduling,
                "runPolicy": {"maxRestarts": 2},
                **spec,
            },
        }
        self.apply(body)
        return name

    def get(self, kind: str, name: str) -> dict[str, Any]:
        out = self.kubectl("get", kind, name, "-n", self.namespace, "-o", "json")
        return dict(json.loads(out.stdout))

    def status(self, run: str) -> dict[str, Any]:
        return dict(self.get("benchmarkrun", run).get("status") or {})

    def wait_status(
        self,
        run: str,
        pred: Callable[[dict[str, Any]], Any],
        timeout: float,
        what: str,
        every: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            st = self.status(run)
            if pred(st):
                return st
            if every is not None:
                every()
            if time.monotonic() > deadline:
                brief = json.dumps(st)[:3000]
                pytest.fail(f"{run}: timed out after {timeout}s waiting for {what}; status: {brief}\n{self.debug(run)}")
            time.sleep(1)

    def wait_finished(self, run: str, timeout: float = 600, every: Callable[[], None] | None = None) -> dict[str, Any]:
        return self.wait_status(
            run, lambda s: s.get("phase") in ("Succeeded", "Failed"), timeout, "a final phase", every
        )

    def get_br(self, run: str, wide: bool = False) -> dict[str, str]:
        """``kubectl get br RUN`` as a user sees it: printer columns by header (``wide``: with ``-o wide``,
        which adds the priority-1 columns such as READY)."""
        out = self.kubectl(
            "get", "br", run, "-n", self.namespace, *(["-o", "wide"] if wide else [])
        ).stdout.splitlines()
        header, row = out[0], out[1]
        starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
        cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        return dict(zip(names, cells, strict=True))

    def events(self, run: str) -> list[dict[str, Any]]:
        out = self.kubectl(
            "get", "events", "-n", self.namespace, "--field-selector", f"involvedObject.name={run}", "-o", "json"
        )
        return list(json.loads(out.stdout)["items"])

    def logs(self, pod: str, container: str | None = None) -> str:
        args = ["logs", pod, "-n", self.namespace] + (["-c", container] if container else [])
        return self.kubectl(*args, check=False).stdout

    def debug(self, run: str) -> str:
        pods = self.kubectl("get", "pods,jobs,pvc", "-n", self.namespace, "-o", "wide", check=False).stdout
        events = self.kubectl("get", "events", "-n", self.namespace, "--sort-by=.lastTimestamp", check=False).stdout
        return (
            f"--- objects\n{pods}\n--- events\n{events[-4000:]}\n--- launcher\n{self.logs(f'{run}-launcher')[-3000:]}"
        )

    def kill_container(self, pod: str) -> None:
        """SIGKILL the pod's main container, as a crashing process or the OOM killer would."""
        body = self.get("pod", pod)
        cid = body["status"]["containerStatuses"][0]["containerID"]
        node = body["spec"].get("nodeName")
        by_node = dict(zip(self.real_nodes, self.containerd_addresses, strict=False))
        address = by_node.get(node, self.containerd_address)  # the containerd of the pod's own node
        if address and cid.startswith("containerd://"):
            subprocess.run(
                [
                    "ctr",
                    "--address",
                    address,
                    "-n",
                    "k8s.io",
                    "tasks",
                    "kill",
                    "-s",
                    "SIGKILL",
                    cid.split("://", 1)[1],
                ],
                check=True,
                capture_output=True,
            )
        else:  # another cluster: kill every process of the container from inside
            self.kubectl("exec", pod, "-n", self.namespace, "--", "sh", "-c", "kill -9 -1", check=False)


def _build_images(containerd_addresses: tuple[str, ...]) -> None:
    """Build the images and load them into every real node's containerd."""
    if os.environ.get("MLBENCH_E2E_BUILD_IMAGES", "1") == "0":
        return
    env = dict(os.environ)
    if containerd_addresses:
        env["MLBENCH_CONTAINERD_ADDRESSES"] = " ".join(containerd_addresses)
    proc = subprocess.run(
        ["bash", str(REPO / "hack/images.sh"), "--debian-base", "--load"],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"hack/images.sh failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")


@dataclass(frozen=True)
class Release:
    """The e2e's Helm release of charts/mlbench in ``mlbench-system``: tests/e2e/deploy/values.yaml, the real nodes'
    scheduling as a second values file, and the post-renderer (tests/e2e/post_render.py)."""

    cluster: KubeCluster
    helm: Helm
    scheduling_values: Path

    def args(self) -> list[str]:
        return [
            RELEASE,
            str(CHART),
            "-n",
            OPERATOR_NAMESPACE,
            "-f",
            str(DEPLOY / "values.yaml"),
            "-f",
            str(self.scheduling_values),
            "--post-renderer",
            sys.executable,
            "--post-renderer-args",
            str(POST_RENDER),
            "--post-renderer-args",
            self.cluster.kubectl_bin,
            "--wait",
            "--timeout=180s",
        ]

    def install(self) -> None:
        # --take-ownership: the cluster-scoped objects (catalog, ClusterRoles) that earlier tests of the session
        # applied with kubectl; a first install on a fresh cluster needs no such flag
        self.helm("install", *self.args(), "--take-ownership", timeout=240)

    def upgrade(self, *sets: str) -> None:
        """``helm upgrade --reuse-values`` with ``--set`` ``sets``, waited for."""
        self.helm("upgrade", *self.args(), "--reuse-values", *(a for s in sets for a in ("--set", s)), timeout=240)

    def uninstall(self) -> None:
        """As docs/install.md says: the runs first (the e2e's, by their label: the kwok tests' runs are served by
        operators of their own), then ``helm uninstall``; then nothing of the release may be left but the CRDs."""
        manifest = self.helm("get", "manifest", RELEASE, "-n", OPERATOR_NAMESPACE).stdout
        selector = ",".join(f"{k}={v}" for k, v in E2E_LABEL.items())
        runs = ("delete", "benchmarksweeps,benchmarkruns", "-A", "-l", selector, "--wait", "--timeout=300s")
        self.cluster.kubectl(*runs, check=True, timeout=330)
        self.helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait", "--timeout=180s", timeout=240)
        left = self.cluster.kubectl("get", "-f", "-", "--ignore-not-found", "-o", "name", input=manifest, check=True)
        assert left.stdout.strip() == "", f"left after helm uninstall: {left.stdout}"
        assert self.helm("list", "-n", OPERATOR_NAMESPACE, "-q").stdout.strip() == ""
        secrets = ("get", "secrets", "-n", OPERATOR_NAMESPACE, "-l", f"owner=helm,name={RELEASE}", "-o", "name")
        assert self.cluster.kubectl(*secrets, check=True).stdout.strip() == "", "the release's history is left"


def _install_operator(cluster: KubeCluster, real_node: RealNodeInfo, workdir: Path) -> Release:
    """As docs/install.md says: the namespace with its Pod Security labels, then ``helm install`` (the chart's
    CRDs first, then everything), waited for until the operator's Deployment is available."""
    scheduling = workdir / "scheduling.yaml"
    scheduling.write_text(yaml.safe_dump({"operator": real_node.scheduling()}))
    release = Release(cluster, Helm(build(), workdir / "helm-home", cluster.kubeconfig), scheduling)
    create_namespace(cluster, OPERATOR_NAMESPACE)  # enforcing restricted, as manifests/operator/namespace.yaml
    # what an earlier session left (a release, or the Deployment of a kustomize install): a new pod for the image
    # loaded under the same tag (IfNotPresent keeps the old one otherwise)
    if release.helm("status", RELEASE, "-n", OPERATOR_NAMESPACE, check=False).returncode == 0:
        release.helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait", timeout=240)
    cluster.kubectl("delete", "deployment", "mlbench-operator", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
    try:
        release.install()
    except AssertionError as err:
        pods = cluster.kubectl("get", "pods,events", "-n", OPERATOR_NAMESPACE, "-o", "wide").stdout
        logs = cluster.kubectl("logs", "deployment/mlbench-operator", "-n", OPERATOR_NAMESPACE, "--tail=50").stdout
        pytest.fail(f"helm install did not make the operator available: {err}\n{pods}\n{logs}")
    return release


def _dataset_server(cluster: KubeCluster, namespace: str, scheduling: dict[str, Any]) -> None:
    """busybox httpd in the namespace serving the JPEG CIFAR-10 tarball (copied in with kubectl cp)."""
    labels = {"app": "datasets"}
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "datasets", "namespace": namespace, "labels": labels},
        "spec": {
            **scheduling,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "runAsGroup": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "httpd",
                    "image": BUSYBOX,
                    "command": ["httpd", "-f", "-v", "-p", "8080", "-h", "/srv"],
                    "ports": [{"containerPort": 8080}],
                    "volumeMounts": [{"name": "srv", "mountPath": "/srv"}],
                    "securityContext": security,
                }
            ],
            "volumes": [{"name": "srv", "emptyDir": {}}],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "datasets", "namespace": namespace},
        # headless: the name resolves to the pod itself (pod -> ClusterIP -> pod on one bridge would
        # need br_netfilter, which stock Debian kernels load only on demand)
        "spec": {"clusterIP": "None", "selector": labels, "ports": [{"port": 8080, "targetPort": 8080}]},
    }
    for body in (pod, service):
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body), check=True)
    cluster.kubectl("wait", "--for=condition=Ready", "pod/datasets", "-n", namespace, "--timeout=120s", check=True)
    cluster.kubectl("cp", str(DATASET), f"{namespace}/datasets:/srv/{DATASET.name}", check=True, timeout=120)


def wait_training(e2e: E2E, run: str) -> None:
    """Wait until the first epoch has begun (after the data is decoded): what comes next lands mid-training."""
    e2e.wait_status(
        run,
        lambda s: s.get("phase") == "Running" and '"epoch_start"' in e2e.logs(f"{run}-launcher"),
        600,
        "the first epoch to start",
    )


def serving_data(cluster: KubeCluster, real_node: RealNodeInfo, namespace: str) -> E2E:
    """The dataset server in ``namespace`` (on a real node), and the E2E handle of that namespace."""
    scheduling = real_node.scheduling()
    _dataset_server(cluster, namespace, scheduling)
    return E2E(
        cluster=cluster,
        namespace=namespace,
        scheduling=scheduling,
        containerd_address=real_node.containerd_address,
        dataset_url=f"http://datasets.{namespace}.svc.cluster.local:8080/{DATASET.name}",
        dataset_sha256=sha256(DATASET),
        real_nodes=real_node.names,
        containerd_addresses=real_node.containerd_addresses,
    )


@pytest.fixture(scope="session")
def e2e(kube_cluster: KubeCluster, real_node: RealNodeInfo) -> Iterator[E2E]:
    """Images built and loaded, the operator running as a Deployment, a restricted namespace with data."""
    if not DATASET.exists():
        pytest.skip(f"{DATASET} is not there")
    _build_images(real_node.containerd_addresses or tuple(filter(None, [real_node.containerd_address])))
    if kube_cluster.local is not None:
        kube_cluster.local.ensure_node_images()
    workdir = Path(tempfile.mkdtemp(prefix="mlbench-e2e-helm-"))
    release = _install_operator(kube_cluster, real_node, workdir)
    namespace = create_namespace(kube_cluster, f"mlbench-e2e-{SESSION}")  # enforcing restricted
    env = serving_data(kube_cluster, real_node, namespace)
    env.release = release
    yield env
    try:
        release.uninstall()  # the runs first: the operator must still run to release them
    finally:
        kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false")
        if env.tasks:
            kube_cluster.kubectl("delete", "benchmarktask", *env.tasks, "--wait=false")
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def e2e_task(e2e: E2E) -> str:
    """The shortened smoke task, its dataset fetched by the operator from the in-cluster server."""
    return e2e.task("cifar10")
