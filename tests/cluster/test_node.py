"""The test cluster's real node: pods really run (containerd + runc), get IPs on the
bridge, resolve each other through CoreDNS, reach the API through the ``kubernetes``
Service (kube-proxy), are OOM-killed by the kernel, and mount local PersistentVolumes.

The first tests need no cluster: they check the node's generated configuration and
images.  The rest need the real node (root, containerd, ...) and skip with the reason
when the cluster runs without it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import images
from tests.cluster import node as rn
from tests.cluster.plugin import (
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    KubeCluster,
    get_json,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------- no cluster needed
def _archive_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_docker_archive_is_valid_and_reproducible() -> None:
    layer = images.layer_tar([images.Entry("bin", "dir"), images.Entry("bin/x", "file", 0o755, b"#!x\n")])
    a = images.docker_archive("docker.io/mlbench/x:1", layer, {"Cmd": ["/bin/x"]})
    assert a == images.docker_archive("docker.io/mlbench/x:1", layer, {"Cmd": ["/bin/x"]})
    files = _archive_members(a)
    manifest = json.loads(files["manifest.json"])
    assert manifest[0]["RepoTags"] == ["docker.io/mlbench/x:1"]
    config = json.loads(files[manifest[0]["Config"]])
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert files[manifest[0]["Layers"][0]] == layer
    assert config["config"]["Cmd"] == ["/bin/x"]


@pytest.mark.skipif(not images.BUSYBOX.exists(), reason="busybox-static not installed")
def test_busybox_image_has_the_tools_tests_use(tmp_path: Path) -> None:
    archive, key = images.build_archive(images.BUSYBOX_IMAGE, tmp_path)
    assert images.build_archive(images.BUSYBOX_IMAGE, tmp_path) == (archive, key)  # cached
    files = _archive_members(archive.read_bytes())
    manifest = json.loads(files["manifest.json"])
    with tarfile.open(fileobj=io.BytesIO(files[manifest[0]["Layers"][0]])) as tar:
        links = {m.name: m.linkname for m in tar.getmembers() if m.issym()}
        names = set(tar.getnames())
    assert "bin/busybox" in names
    by_name = {Path(path).name: target for path, target in links.items()}
    for tool in ("sh", "nslookup", "nc", "wget", "httpd", "tail", "seq"):
        assert by_name.get(tool) == "/bin/busybox", tool


def test_node_config_keeps_pods_on_this_machine(tmp_path: Path) -> None:
    paths = rn.NodePaths(tmp_path / "node", tmp_path / "root")
    cni = rn.cni_conflist(paths)
    bridge = cni["plugins"][0]
    assert bridge["bridge"] == rn.BRIDGE
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": rn.POD_CIDR, "gateway": rn.BRIDGE_IP}]]
    conf = rn.containerd_config(paths)
    assert "restrict_oom_score_adj = true" in conf
    assert f'conf_dir = "{paths.cni_conf_dir}"' in conf
    assert "/etc/cni" not in conf
    proxy = rn.kube_proxy_config(tmp_path / "kc", 1, 2)
    assert proxy["nodePortAddresses"] == [f"{rn.BRIDGE_IP}/32"]
    assert "forward" not in rn.corefile(tmp_path / "kc", 3)  # no upstream DNS
    assert ["-i", rn.BRIDGE, "-j", "DROP"] in rn.isolation_rules()


def test_kubelet_config_taints_and_uses_cluster_dns(tmp_path: Path) -> None:
    paths = rn.NodePaths(tmp_path / "node", tmp_path / "root")
    cfg = rn.kubelet_config(paths, tmp_path / "pki", 10250, 10248)
    assert cfg["registerWithTaints"] == [rn.REAL_NODE_TAINT]
    assert cfg["clusterDNS"] == [rn.BRIDGE_IP]
    assert cfg["clusterDomain"] == "cluster.local"
    assert cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["failCgroupV1"] is False
    assert cfg["containerRuntimeEndpoint"] == f"unix://{paths.containerd_socket}"
    assert cfg["imageGCHighThresholdPercent"] == 100  # imported images can never be pulled again
    assert cfg["authentication"]["anonymous"]["enabled"] is False


def test_local_pvs_are_pinned_to_the_real_node(tmp_path: Path) -> None:
    objs = rn.storage_objects(tmp_path, count=2)
    sc, pvs = objs[0], objs[1:]
    assert sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    assert [pv["spec"]["local"]["path"] for pv in pvs] == [str(tmp_path / "pv-0"), str(tmp_path / "pv-1")]
    term = pvs[0]["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["values"] == [rn.NODE_NAME]


def test_blocker_names_the_switch() -> None:
    assert rn.real_node_blocker({"MLBENCH_REAL_NODE": "0"}) == "MLBENCH_REAL_NODE=0"
    assert rn.real_node_required({"MLBENCH_REAL_NODE": "1"})
    assert not rn.real_node_required({})


def test_pv_reclaimer_only_touches_its_own_dir(tmp_path: Path) -> None:
    from tests.cluster.pvreclaim import released_volumes

    def pv(name: str, path: Path, phase: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"local": {"path": str(path)}}, "status": {"phase": phase}}

    base = tmp_path / "pv"
    pvs = [pv("a", base / "pv-0", "Released"), pv("b", base / "pv-1", "Bound"), pv("c", Path("/etc"), "Released")]
    assert released_volumes(pvs, base) == [("a", (base / "pv-0").resolve())]


# ------------------------------------------------------------ real node
def _pod(name: str, node: rn.RealNodeInfo, command: str, **extra: Any) -> dict[str, Any]:
    """A busybox pod on the real node that the ``restricted`` Pod Security level admits (the test namespaces
    enforce it): it runs as nobody (65534), with the runtime's seccomp profile and no capabilities."""
    container: dict[str, Any] = {
        "name": "main",
        "image": images.BUSYBOX_IMAGE,
        "command": ["sh", "-c", command],
        "securityContext": RESTRICTED_CONTAINER_CONTEXT,
    }
    container.update(extra.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": extra.pop("labels", {"app": name})},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": RESTRICTED_POD_CONTEXT,
            "containers": [container],
            **node.scheduling(),
            **extra,
        },
    }


def _apply(kube_cluster: KubeCluster, ns: str, *objs: dict[str, Any]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})
    res = kube_cluster.kubectl("-n", ns, "apply", "-f", "-", input=body)
    assert res.returncode == 0, res.stderr


def _phase(kube_cluster: KubeCluster, ns: str, name: str, *phases: str) -> dict[str, Any] | None:
    pod = get_json(kube_cluster, "-n", ns, "pod", name)
    return pod if pod and pod.get("status", {}).get("phase") in phases else None


def _finished(kube_cluster: KubeCluster, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    pod: dict[str, Any] = wait_for(
        lambda: _phase(kube_cluster, ns, name, "Succeeded", "Failed"), timeout=timeout, what=f"pod {name} to finish"
    )
    return pod


def _logs(kube_cluster: KubeCluster, ns: str, name: str) -> str:
    res = kube_cluster.kubectl("-n", ns, "logs", name)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.cluster
@pytest.mark.realnode
def test_real_node_ready_tainted_and_labelled(kube_cluster: KubeCluster, real_node: rn.RealNodeInfo) -> None:
    if real_node.name is None:
        pytest.skip("external cluster without a designated real node")
    node = get_json(kube_cluster, "node", real_node.name)
    assert rn.ready_condition(node), node["status"]["conditions"]
    assert node["metadata"]["labels"][rn.REAL_NODE_KEY] == "true"
    assert rn.has_real_node_taint(node)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    # kwok manages only annotated nodes: this one has a kubelet of its own
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == rn.BRIDGE_IP


@pytest.mark.cluster
@pytest.mark.realnode
def test_pod_runs_and_logs_and_exec_work(kube_cluster: KubeCluster, namespace: str, real_node: rn.RealNodeInfo) -> None:
    t0 = time.monotonic()
    _apply(kube_cluster, namespace, _pod("hello", real_node, "echo hello from $(hostname); sleep 30"))
    running = lambda: _phase(kube_cluster, namespace, "hello", "Running")  # noqa: E731
    pod: dict[str, Any] = wait_for(running, timeout=60, what="Running")
    print(f"\napply -> Running: {time.monotonic() - t0:.2f}s")
    assert pod["status"]["podIP"].startswith(rn.POD_CIDR.rsplit(".", 1)[0] + ".")
    if real_node.name:
        assert pod["spec"]["nodeName"] == real_node.name
    wait_for(lambda: "hello from hello" in _logs(kube_cluster, namespace, "hello"), timeout=20, what="log line")
    res = kube_cluster.kubectl("-n", namespace, "exec", "hello", "--", "cat", "/etc/resolv.conf")
    assert res.returncode == 0, res.stderr
    assert f"nameserver {rn.BRIDGE_IP}" in res.stdout
    assert f"{namespace}.svc.cluster.local" in res.stdout


@pytest.mark.cluster
@pytest.mark.realnode
def test_pods_behind_headless_service_resolve_and_talk(
    kube_cluster: KubeCluster, namespace: str, real_node: rn.RealNodeInfo
) -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "peers"},
        "spec": {"clusterIP": "None", "selector": {"group": "peers"}, "ports": [{"name": "tcp", "port": 7000}]},
    }
    fqdn = f"server.peers.{namespace}.svc.cluster.local"
    token = uuid.uuid4().hex
    server = _pod(
        "server",
        real_node,
        # listen again after a connection that brought nothing (a client whose connect timed
        # out on its side after the handshake completed on ours): seen once in CI
        "until [ -s /tmp/got ]; do echo ack | nc -l -p 7000 > /tmp/got; done; echo received: $(cat /tmp/got)",
        labels={"group": "peers"},
        hostname="server",
        subdomain="peers",
    )
    client = _pod(
        "client",
        real_node,
        # retry while the DNS record appears (endpoints follow the pod's readiness)
        f"for i in $(seq 1 60); do nslookup {fqdn} >/tmp/ns 2>&1 && break; sleep 0.5; done; cat /tmp/ns; "
        f"for i in $(seq 1 20); do echo {token} | nc -w 3 {fqdn} 7000 | grep -q ack && break; sleep 0.5; done; "
        f"for i in $(seq 1 60); do nslookup client.peers.{namespace}.svc.cluster.local && break; sleep 0.5; done",
        labels={"group": "peers"},
        hostname="client",
        subdomain="peers",
    )
    _apply(kube_cluster, namespace, svc, server, client)
    # the client first: its retries are bounded but can outlast a minute on a loaded machine (each failed
    # nslookup waits for its own timeout), and the server only ends once a try got through
    cli = _finished(kube_cluster, namespace, "client", timeout=300)
    client_log = _logs(kube_cluster, namespace, "client")
    try:
        srv = _finished(kube_cluster, namespace, "server", timeout=30)
    except pytest.fail.Exception:
        pytest.fail(f"the server never got the token; the client said:\n{client_log[-3000:]}")
    server_log = _logs(kube_cluster, namespace, "server")
    assert srv["status"]["podIP"] in client_log, client_log  # the name resolved to the server pod
    assert cli["status"]["podIP"] in client_log, client_log  # and the client's own name too
    assert f"received: {token}" in server_log, (server_log, client_log)


@pytest.mark.cluster
@pytest.mark.realnode
def test_pod_reaches_the_kubernetes_service(
    kube_cluster: KubeCluster, namespace: str, real_node: rn.RealNodeInfo
) -> None:
    # plain HTTP to the HTTPS port: the apiserver itself answers (busybox's TLS is too old
    # for it), which proves the bytes went pod -> 10.96.0.1:443 (kube-proxy) -> apiserver
    cmd = (
        "nslookup kubernetes.default.svc.cluster.local; "
        "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 kubernetes.default.svc.cluster.local 443"
    )
    _apply(kube_cluster, namespace, _pod("api", real_node, cmd))
    _finished(kube_cluster, namespace, "api")
    log = _logs(kube_cluster, namespace, "api")
    assert "10.96.0.1" in log, log
    assert "Client sent an HTTP request to an HTTPS server" in log, log


@pytest.mark.cluster
@pytest.mark.realnode
def test_memory_hog_is_oom_killed(kube_cluster: KubeCluster, namespace: str, real_node: rn.RealNodeInfo) -> None:
    limits = {"resources": {"limits": {"memory": "24Mi", "cpu": "500m"}, "requests": {"memory": "24Mi", "cpu": "100m"}}}
    _apply(kube_cluster, namespace, _pod("hog", real_node, "tail /dev/zero", container=limits))
    pod = _finished(kube_cluster, namespace, "hog")
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["reason"] == "OOMKilled", pod["status"]
    assert state["exitCode"] == 137
    assert pod["status"]["phase"] == "Failed"


@pytest.mark.cluster
@pytest.mark.realnode
def test_pvc_binds_and_pod_writes_then_volume_is_recycled(
    kube_cluster: KubeCluster, namespace: str, real_node: rn.RealNodeInfo
) -> None:
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    writer = _pod(
        "writer",
        real_node,
        "echo written-by-pod > /data/proof && ls -l /data",
        container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},  # as 65534 (the PV dir is 0777)
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
    )
    _apply(kube_cluster, namespace, pvc, writer)
    pod = _finished(kube_cluster, namespace, "writer")
    assert pod["status"]["phase"] == "Succeeded", _logs(kube_cluster, namespace, "writer")
    claim = get_json(kube_cluster, "-n", namespace, "pvc", "data")
    assert claim["status"]["phase"] == "Bound"
    assert claim["spec"]["storageClassName"] == rn.STORAGE_CLASS  # the default class
    pv = get_json(kube_cluster, "pv", claim["spec"]["volumeName"])
    if kube_cluster.local is None:
        return  # another cluster: its volumes are not on this machine
    host_path = Path(pv["spec"]["local"]["path"])
    assert (host_path / "proof").read_text() == "written-by-pod\n"
    # released volumes are wiped and offered again (the pv-reclaimer)
    kube_cluster.kubectl("-n", namespace, "delete", "pod", "writer", "--wait=true", check=True)
    kube_cluster.kubectl("-n", namespace, "delete", "pvc", "data", "--wait=true", check=True)
    wait_for(
        lambda: (
            (get_json(kube_cluster, "pv", pv["metadata"]["name"]) or {}).get("status", {}).get("phase") == "Available"
        ),
        timeout=30,
        what="the released PV back to Available",
    )
    assert not any(host_path.iterdir())


@pytest.mark.cluster
@pytest.mark.realnode
def test_pod_traffic_cannot_leave_the_bridge(kube_cluster: KubeCluster, real_node: rn.RealNodeInfo) -> None:
    """The FORWARD guard is installed and comes before anything that could accept a
    new connection from a pod to another interface (checked on the rules, without
    sending a packet anywhere)."""
    if kube_cluster.local is None:
        pytest.skip("the guard is a property of the local cluster's host")
    chain = subprocess.run(["iptables", "-w", "-S", rn.ISOLATION_CHAIN], capture_output=True, text=True, check=True)
    rules = [line.split()[2:] for line in chain.stdout.splitlines() if line.startswith("-A ")]
    assert rules == rn.isolation_rules()
    forward = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True, check=True)
    jumps = [line for line in forward.stdout.splitlines() if line.startswith("-A FORWARD")]
    ours = jumps.index(f"-A FORWARD -j {rn.ISOLATION_CHAIN}")
    # before ours, only kube-proxy's chains (they accept established flows and Service traffic)
    assert all("-j KUBE-" in j for j in jumps[:ours]), jumps
    # the mangle copy comes first of all: nothing accepts in mangle, so nothing can bypass it
    mangle = subprocess.run(["iptables", "-w", "-t", "mangle", "-S"], capture_output=True, text=True, check=True)
    lines = mangle.stdout.splitlines()
    assert [line.split()[2:] for line in lines if line.startswith(f"-A {rn.ISOLATION_CHAIN} ")] == rn.isolation_rules()
    assert next(line for line in lines if line.startswith("-A FORWARD")) == f"-A FORWARD -j {rn.ISOLATION_CHAIN}"
    nat = subprocess.run(
        ["iptables", "-w", "-t", "nat", "-S", "POSTROUTING"], capture_output=True, text=True, check=True
    )
    assert "10.213.0.0/24" not in nat.stdout  # no masquerading of pod traffic by CNI


@pytest.mark.cluster
@pytest.mark.realnode
def test_images_sh_prunes_the_image_ids_no_name_points_to(real_node: rn.RealNodeInfo, tmp_path: Path) -> None:
    """The CRI keeps a ``sha256:<id>`` ref of every image a pod used; when ``make images-load`` replaces the
    runner, the old one's ref holds its ~6 GB for good. ``hack/images.sh prune`` (run by every load) removes
    the refs whose image no name points to, and no other."""
    if real_node.containerd_address is None:
        pytest.skip("no containerd of the real node to prune")
    ctr = [images.ctr_bin(), "--address", real_node.containerd_address, "--namespace", "k8s.io"]
    marker = uuid.uuid4().hex.encode()  # an image of its own: no other ref points to it
    layer = images.layer_tar([images.Entry("marker", "file", 0o644, marker)])
    archive = tmp_path / "old.tar"
    archive.write_bytes(images.docker_archive("docker.io/mlbench/old-runner:test", layer, {}))
    subprocess.run([*ctr, "images", "import", str(archive)], check=True, capture_output=True)
    stale = "sha256:" + hashlib.sha256(marker).hexdigest()  # as the CRI names it: by id
    subprocess.run([*ctr, "images", "tag", "docker.io/mlbench/old-runner:test", stale], check=True, capture_output=True)
    kept = "sha256:" + hashlib.sha256(marker + b"kept").hexdigest()  # an id ref whose image has a name
    subprocess.run([*ctr, "images", "tag", images.BUSYBOX_IMAGE, kept], check=True, capture_output=True)
    subprocess.run([*ctr, "images", "rm", "docker.io/mlbench/old-runner:test"], check=True, capture_output=True)

    def refs() -> set[str]:
        out = subprocess.run([*ctr, "images", "ls", "-q"], check=True, capture_output=True, text=True).stdout
        return set(out.split())

    try:
        before = refs()
        assert {stale, kept} <= before
        env = {**os.environ, "MLBENCH_CONTAINERD_ADDRESS": real_node.containerd_address}
        done = subprocess.run(
            ["bash", str(REPO / "hack" / "images.sh"), "prune"], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        after = refs()
        assert stale not in after, done.stderr
        assert kept in after, "its image has a name"
        assert {ref for ref in before if not ref.startswith("sha256:")} <= after, "a named image was removed"
    finally:
        subprocess.run([*ctr, "images", "rm", stale, kept], check=False, capture_output=True)
