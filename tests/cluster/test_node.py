"""The test cluster's real nodes: pods really run (containerd + runc), get IPs on their
node's bridge, reach pods of another node by routes (no masquerade), resolve each other
through CoreDNS, reach the API through the ``kubernetes`` Service (each node's
kube-proxy), are OOM-killed by the kernel, and mount local PersistentVolumes.

The first tests need no cluster: they check the nodes' generated configuration and
images.  The rest need the real nodes (root, containerd, ...) and skip with the reason
when the cluster runs without them.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
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
    create_namespace,
    get_json,
    port_probe,
    probe_results,
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


@pytest.mark.multiproc
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


def _paths(tmp_path: Path, index: int = 0) -> rn.NodePaths:
    node = rn.NodeSpec(index)
    return rn.NodePaths(node, tmp_path / "nodes" / node.name, tmp_path / "roots" / node.name)


def test_node_config_keeps_pods_on_this_machine(tmp_path: Path) -> None:
    paths = _paths(tmp_path, 1)
    cni = rn.cni_conflist(paths)
    bridge = cni["plugins"][0]
    assert bridge["bridge"] == rn.POD_BRIDGE
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.213.2.0/24", "gateway": "10.213.2.1"}]]
    conf = rn.containerd_config(paths)
    assert "restrict_oom_score_adj = true" in conf
    assert f'conf_dir = "{paths.cni_conf_dir}"' in conf
    assert "/etc/cni" not in conf
    proxy = rn.kube_proxy_config(paths.node, tmp_path / "kc", 1, 2)
    assert proxy["nodePortAddresses"] == ["10.213.0.12/32"]
    assert proxy["clusterCIDR"] == rn.CLUSTER_CIDR  # no masquerade between the nodes' pods
    assert proxy["hostnameOverride"] == "mlbench-node-1"
    assert "forward" not in rn.corefile(tmp_path / "kc", 3)  # no upstream DNS
    assert ["-i", rn.BRIDGE, "-j", "DROP"] in rn.isolation_rules()


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, {("mlbench-node-0", "10.213.0.11", "10.213.1.0/24")}),
        (
            3,
            {
                ("mlbench-node-0", "10.213.0.11", "10.213.1.0/24"),
                ("mlbench-node-1", "10.213.0.12", "10.213.2.0/24"),
                ("mlbench-node-2", "10.213.0.13", "10.213.3.0/24"),
            },
        ),
    ],
)
def test_nodes_have_their_own_addresses_and_pod_cidrs(count: int, expected: set[tuple[str, str, str]]) -> None:
    nodes = rn.node_specs(count)
    assert {(n.name, n.ip, n.pod_cidr) for n in nodes} == expected
    assert len({n.cgroup_root for n in nodes}) == count
    assert len({n.host_veth for n in nodes}) == count
    assert all(len(n.host_veth) <= 15 for n in nodes)  # IFNAMSIZ


def test_pod_networks_are_joined_by_routes_through_their_nodes() -> None:
    nodes = rn.node_specs(3)
    cmds = rn.node_network_commands(nodes[1], nodes)
    ns_routes = [c[5:] for c in cmds if c[:5] == ["ip", "-n", "mlbench-node-1", "route", "add"]]
    assert ["default", "via", rn.BRIDGE_IP] in ns_routes
    assert ["10.213.1.0/24", "via", "10.213.0.11"] in ns_routes  # node 0's pods via node 0 (host-gw)
    assert ["10.213.3.0/24", "via", "10.213.0.13"] in ns_routes
    assert ["10.213.2.0/24", "via", "10.213.0.12"] not in ns_routes  # its own pods are on its bridge
    assert cmds[-1] == ["ip", "route", "replace", "10.213.2.0/24", "via", "10.213.0.12", "dev", rn.BRIDGE]
    # every agent of the node runs in its namespace
    assert nodes[1].in_netns(["kubelet"])[:2] == ["nsenter", "--net=/run/netns/mlbench-node-1"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("", rn.DEFAULT_NODE_COUNT), ("1", 1), ("3", 3), ("0", None), ("5", None), ("two", None)],
)
def test_node_count_is_checked(raw: str, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="MLBENCH_REAL_NODES"):
            rn.node_count({"MLBENCH_REAL_NODES": raw})
    else:
        assert rn.node_count({"MLBENCH_REAL_NODES": raw}) == expected


def test_kubelet_config_taints_and_uses_cluster_dns(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    cfg = rn.kubelet_config(paths, tmp_path / "pki", 10250, 10248)
    assert cfg["address"] == "10.213.0.11"
    assert cfg["cgroupRoot"] == "/mlbench-node-0"
    assert cfg["registerWithTaints"] == [rn.REAL_NODE_TAINT]
    assert cfg["clusterDNS"] == [rn.BRIDGE_IP]
    assert cfg["clusterDomain"] == "cluster.local"
    assert cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["failCgroupV1"] is False
    assert cfg["containerRuntimeEndpoint"] == f"unix://{paths.containerd_socket}"
    assert cfg["imageGCHighThresholdPercent"] == 100  # imported images can never be pulled again
    assert cfg["authentication"]["anonymous"]["enabled"] is False


def test_local_pvs_are_pinned_to_their_nodes(tmp_path: Path) -> None:
    objs = rn.storage_objects(tmp_path, rn.node_specs(2), count=2)
    sc, pvs = objs[0], [o for o in objs if o["kind"] == "PersistentVolume" and "local" in o["spec"]]
    assert sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    assert [pv["spec"]["local"]["path"] for pv in pvs] == [
        str(tmp_path / name) for name in ("n0-pv-0", "n0-pv-1", "n1-pv-0", "n1-pv-1")
    ]
    pinned = [pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0] for pv in pvs]
    assert [term["values"] for term in pinned] == [["mlbench-node-0"]] * 2 + [["mlbench-node-1"]] * 2
    assert len({pv["metadata"]["name"] for pv in pvs}) == 4


def test_shared_pvs_are_readwritemany_on_every_node(tmp_path: Path) -> None:
    objs = rn.storage_objects(tmp_path, rn.node_specs(2), count=1)
    classes = {o["metadata"]["name"]: o for o in objs if o["kind"] == "StorageClass"}
    assert set(classes) == {rn.STORAGE_CLASS, rn.SHARED_STORAGE_CLASS}
    assert "annotations" not in classes[rn.SHARED_STORAGE_CLASS]["metadata"]  # not the default class
    shared = [o for o in objs if o.get("spec", {}).get("storageClassName") == rn.SHARED_STORAGE_CLASS]
    assert len(shared) == rn.SHARED_PV_COUNT
    assert all("ReadWriteMany" in pv["spec"]["accessModes"] and "nodeAffinity" not in pv["spec"] for pv in shared)
    assert all(Path(pv["spec"]["hostPath"]["path"]).parent == tmp_path for pv in shared)


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
def _pod(name: str, node: rn.RealNodeInfo, command: str, on: str | None = None, **extra: Any) -> dict[str, Any]:
    """A busybox pod on a real node (the one named ``on``, if given) that the ``restricted`` Pod Security level
    admits (the test namespaces enforce it): it runs as nobody (65534), with the runtime's seccomp profile and
    no capabilities."""
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
            **node.scheduling(on),
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
def test_real_nodes_ready_tainted_and_labelled(kube_cluster: KubeCluster, real_node: rn.RealNodeInfo) -> None:
    if real_node.name is None:
        pytest.skip("external cluster without a designated real node")
    if kube_cluster.local is not None:
        assert real_node.names == tuple(n.name for n in rn.node_specs(rn.node_count()))
    for index, name in enumerate(real_node.names):
        node = get_json(kube_cluster, "node", name)
        assert rn.ready_condition(node), node["status"]["conditions"]
        assert node["metadata"]["labels"][rn.REAL_NODE_KEY] == "true"
        assert rn.has_real_node_taint(node)
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        # kwok manages only annotated nodes: this one has a kubelet of its own
        assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
        if kube_cluster.local is not None:
            addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
            assert addresses["InternalIP"] == rn.NodeSpec(index).ip


@pytest.mark.cluster
@pytest.mark.realnode
def test_pod_runs_and_logs_and_exec_work(kube_cluster: KubeCluster, namespace: str, real_node: rn.RealNodeInfo) -> None:
    t0 = time.monotonic()
    hello = _pod("hello", real_node, "echo hello from $(hostname); sleep 30", on=real_node.name)
    _apply(kube_cluster, namespace, hello)
    running = lambda: _phase(kube_cluster, namespace, "hello", "Running")  # noqa: E731
    pod: dict[str, Any] = wait_for(running, timeout=60, what="Running")
    print(f"\napply -> Running: {time.monotonic() - t0:.2f}s")
    if kube_cluster.local is not None:
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(rn.NodeSpec(0).pod_cidr)
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
def test_pods_on_two_nodes_talk_through_a_service_without_masquerade(
    kube_cluster: KubeCluster, namespace: str, real_node: rn.RealNodeInfo
) -> None:
    """A client on the first node reaches a server on the second through a ClusterIP Service (the client
    node's kube-proxy, then the route to the other node's pod CIDR), after resolving the server's own name
    (CoreDNS serves every node); the server sees the client's pod address, not a node's."""
    if len(real_node.names) < 2:
        pytest.skip(f"one real node only ({real_node.names}); MLBENCH_REAL_NODES=1?")
    first, second = real_node.names[:2]
    services = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {**spec, "selector": {"app": "server"}, "ports": [{"name": "tcp", "port": 7000}]},
        }
        for name, spec in (("peers", {"clusterIP": "None"}), ("vip", {}))
    ]
    fqdn = f"server.peers.{namespace}.svc.cluster.local"
    token = uuid.uuid4().hex
    server = _pod(
        "server",
        real_node,
        # the connection stays open for a few seconds (the client sleeps): netstat shows its peer then
        "nc -l -p 7000 > /tmp/got & for i in $(seq 1 900); do [ -s /tmp/got ] && break; sleep 0.1; done; "
        "netstat -tn; wait; echo received: $(cat /tmp/got)",
        on=second,
        labels={"app": "server"},
        hostname="server",
        subdomain="peers",
    )
    client = _pod(
        "client",
        real_node,
        f"for i in $(seq 1 60); do nslookup {fqdn} > /tmp/ns 2>&1 && break; sleep 0.5; done; cat /tmp/ns; "
        f"for i in $(seq 1 30); do (echo {token}; sleep 4) | nc -w 8 vip.{namespace}.svc.cluster.local 7000 "
        "&& break; sleep 1; done",
        on=first,
    )
    _apply(kube_cluster, namespace, *services, server, client)
    cli = _finished(kube_cluster, namespace, "client", timeout=300)
    srv = _finished(kube_cluster, namespace, "server", timeout=60)
    client_log, server_log = _logs(kube_cluster, namespace, "client"), _logs(kube_cluster, namespace, "server")
    assert (cli["spec"]["nodeName"], srv["spec"]["nodeName"]) == (first, second)
    assert srv["status"]["podIP"] in client_log, client_log  # the server's name resolved across nodes
    assert f"received: {token}" in server_log, (server_log, client_log)
    # netstat's peer of the server's port 7000 (ESTABLISHED, or TIME_WAIT once nc closed): the client pod itself
    rows = [line.split() for line in server_log.splitlines() if line.startswith("tcp")]
    peers = {row[4].rsplit(":", 1)[0].removeprefix("::ffff:") for row in rows if row[3].endswith(":7000")}
    assert peers == {cli["status"]["podIP"]}, server_log
    if kube_cluster.local is not None:
        nets = [ipaddress.ip_network(rn.NodeSpec(i).pod_cidr) for i in (0, 1)]
        assert ipaddress.ip_address(cli["status"]["podIP"]) in nets[0]
        assert ipaddress.ip_address(srv["status"]["podIP"]) in nets[1]


@pytest.mark.cluster
@pytest.mark.realnode
def test_each_node_keeps_its_iptables_in_its_own_namespace(
    kube_cluster: KubeCluster, real_node: rn.RealNodeInfo
) -> None:
    """kube-proxy's and the kubelet's rules live in each node's namespace (the kubernetes Service is there),
    so ``down`` never has to touch the host's tables."""
    if kube_cluster.local is None:
        pytest.skip("the nodes' namespaces are a property of the local cluster's host")
    for name in real_node.names:
        nat = subprocess.run(
            ["ip", "netns", "exec", name, "iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert nat.returncode == 0, nat.stderr
        assert "default/kubernetes:https" in nat.stdout


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
def test_a_shared_volume_carries_data_from_one_node_to_another(
    kube_cluster: KubeCluster, namespace: str, real_node: rn.RealNodeInfo
) -> None:
    """A ReadWriteMany claim of the ``shared`` class: written on the first node, read on the second (what a
    dataset volume must do when workers land on several nodes)."""
    if len(real_node.names) < 2:
        pytest.skip(f"one real node only ({real_node.names}); MLBENCH_REAL_NODES=1?")
    if kube_cluster.local is None:
        pytest.skip("the shared class is the local cluster's")
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "shared"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": rn.SHARED_STORAGE_CLASS,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    token = uuid.uuid4().hex
    mount = {
        "container": {"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}],
    }
    first, second = real_node.names[:2]
    _apply(kube_cluster, namespace, pvc, _pod("writer", real_node, f"echo {token} > /data/proof", on=first, **mount))
    assert _finished(kube_cluster, namespace, "writer")["status"]["phase"] == "Succeeded"
    _apply(kube_cluster, namespace, _pod("reader", real_node, "cat /data/proof", on=second, **mount))
    reader = _finished(kube_cluster, namespace, "reader")
    assert reader["status"]["phase"] == "Succeeded", _logs(kube_cluster, namespace, "reader")
    assert reader["spec"]["nodeName"] == second
    assert _logs(kube_cluster, namespace, "reader").strip() == token


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
    assert f"-A FORWARD -j {rn.ISOLATION_CHAIN}" in forward.stdout.splitlines()
    # no kube-proxy or kubelet chain of ours on the host: they live in the nodes' namespaces (other programs, e.g.
    # podman's CNI-FORWARD, may jump ahead of our filter copy: the mangle copy below comes before all of them)
    assert not [line for line in forward.stdout.splitlines() if "-j KUBE-" in line], forward.stdout
    # the mangle copy comes first of all: nothing accepts in mangle, so nothing can bypass it
    mangle = subprocess.run(["iptables", "-w", "-t", "mangle", "-S"], capture_output=True, text=True, check=True)
    lines = mangle.stdout.splitlines()
    assert [line.split()[2:] for line in lines if line.startswith(f"-A {rn.ISOLATION_CHAIN} ")] == rn.isolation_rules()
    assert next(line for line in lines if line.startswith("-A FORWARD")) == f"-A FORWARD -j {rn.ISOLATION_CHAIN}"
    nat = subprocess.run(
        ["iptables", "-w", "-t", "nat", "-S", "POSTROUTING"], capture_output=True, text=True, check=True
    )
    assert "10.213." not in nat.stdout  # no masquerading of pod traffic on the host


@pytest.mark.cluster
@pytest.mark.realnode
def test_network_policy_is_enforced_across_nodes(
    kube_cluster: KubeCluster, namespace: str, real_node: rn.RealNodeInfo
) -> None:
    """kube-router enforces a NetworkPolicy shaped like a run's (peers on any port, a scraper namespace on the
    metrics port only) with real connections from pods on the other node: a peer reaches both ports, a pod of
    the same namespace without the label neither, the scraper namespace only the metrics port, any other
    namespace nothing. The peer's success is the control: the server listens and the route works."""
    if len(real_node.names) < 2:
        pytest.skip(f"one real node only ({real_node.names}); MLBENCH_REAL_NODES=1?")
    first, second = real_node.names[:2]
    scraper, stranger = create_namespace(kube_cluster), create_namespace(kube_cluster)
    try:
        server = _pod(
            "server",
            real_node,
            "mkdir -p /tmp/www && httpd -p 7000 -h /tmp/www && httpd -f -p 7001 -h /tmp/www",
            on=second,
            labels={"app": "server", "run": "r"},
        )
        policy = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "r"},
            "spec": {
                "podSelector": {"matchLabels": {"run": "r"}},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"from": [{"podSelector": {"matchLabels": {"run": "r"}}}]},
                    {
                        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": scraper}}}],
                        "ports": [{"protocol": "TCP", "port": 7001}],
                    },
                ],
            },
        }
        _apply(kube_cluster, namespace, policy, server)
        ip = wait_for(
            lambda: (_phase(kube_cluster, namespace, "server", "Running") or {}).get("status", {}).get("podIP"),
            timeout=60,
            what="the server's address",
        )
        probe = port_probe(ip, (7000, 7001))
        clients = {
            (namespace, "peer"): _pod("peer", real_node, probe, on=first, labels={"run": "r"}),
            (namespace, "neighbour"): _pod("neighbour", real_node, probe, on=first),
            (scraper, "scraper"): _pod("scraper", real_node, probe, on=first),
            (stranger, "stranger"): _pod("stranger", real_node, probe, on=first),
        }
        for (ns, _), pod in clients.items():
            _apply(kube_cluster, ns, pod)
        seen = {
            name: probe_results(_logs(kube_cluster, ns, name))
            for (ns, name) in clients
            if _finished(kube_cluster, ns, name, timeout=120)
        }
        assert seen == {
            "peer": {7000: True, 7001: True},
            "neighbour": {7000: False, 7001: False},
            "scraper": {7000: False, 7001: True},
            "stranger": {7000: False, 7001: False},
        }
    finally:
        for ns in (scraper, stranger):
            kube_cluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")


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
