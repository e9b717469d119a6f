"""The test cluster's REAL nodes: on this machine, each node is a network namespace
with its own containerd + runc + CNI bridge + kubelet + kube-proxy, next to the kwok
fake nodes.

Why: the operator's pods must really run somewhere (ssh between workers, mpirun,
DNS names of a headless Service, datasets on a volume, OOM kills), and a distributed
benchmark must cross nodes.  Topology (every address made here, nothing leaves the
machine):

- the host bridge ``mlbench0`` (10.213.0.1/24) is the nodes' network: the
  kube-apiserver and CoreDNS listen on 10.213.0.1 only; forwarding between it and any
  other interface is dropped (``MLBENCH-ISOLATION``);
- node ``i`` is the network namespace ``mlbench-node-<i>``, joined to ``mlbench0`` by
  a veth (``eth0`` = 10.213.0.<11+i> inside); its pods live on its own bridge ``cni0``
  with the pod CIDR 10.213.<1+i>.0/24; pod networks reach each other by plain routes
  (each node's namespace and the host route a pod CIDR via its node's address: no
  masquerade, no overlay), as a host-gw cluster does;
- its containerd, kubelet and kube-proxy run inside that namespace (``nsenter
  --net``, the host's mount namespace: the kubelet's volumes are containerd's), so
  kube-proxy's and the kubelet's iptables rules are the node's own and never touch the
  host's tables; each node has its own cgroup root ``/mlbench-node-<i>``.

This module holds the pure config builders (unit-tested without root) and the host
operations (namespaces, bridge, routes, iptables guard, cleanup of containers, mounts,
netns, cgroups); ``LocalCluster`` in cluster.py runs the processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.images import BUSYBOX_IMAGE, PAUSE_IMAGE, build_archive, ctr_bin

#: the host's side of the nodes' network: the apiserver, CoreDNS and every node's gateway
BRIDGE = "mlbench0"
BRIDGE_IP = "10.213.0.1"
NODE_NETWORK = "10.213.0.0/24"
#: every address of the cluster's real side: the nodes' network and every pod CIDR
CLUSTER_CIDR = "10.213.0.0/16"
#: ClusterIPs (the apiserver's --service-cluster-ip-range; kube-router lets traffic to them through)
SERVICE_CIDR = "10.96.0.0/16"
#: the bridge of a node's pods, inside the node's namespace
POD_BRIDGE = "cni0"
CLUSTER_DOMAIN = "cluster.local"
REAL_NODE_KEY = "mlbench.io/real-node"
REAL_NODE_LABELS = {REAL_NODE_KEY: "true"}
REAL_NODE_TAINT = {"key": REAL_NODE_KEY, "value": "true", "effect": "NoSchedule"}
#: what a pod needs to land on a real node
REAL_NODE_TOLERATIONS = [{"key": REAL_NODE_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
ISOLATION_CHAIN = "MLBENCH-ISOLATION"
STORAGE_CLASS = "standard"
#: ReadWriteMany volumes every real node mounts (the nodes share this machine's disk, as NFS would share one)
SHARED_STORAGE_CLASS = "shared"
SHARED_PV_COUNT = 4
LOCAL_PV_LABEL = "mlbench.io/local-pv"
#: local PVs per node
LOCAL_PV_COUNT = 6
LOCAL_PV_SIZE = "10Gi"
#: real nodes by default: two (a run crosses nodes) on a 2-core, 24 GiB machine; each node imports the
#: ~6 GB runner image into its own containerd, so a third costs disk and ~1 min of `up` per image change
DEFAULT_NODE_COUNT = 2
MAX_NODE_COUNT = 4
#: the agents of one node, in start order (stopped in reverse); kube-router is the NetworkPolicy enforcer
NODE_AGENTS = ("containerd", "kube-proxy", "kubelet", "kube-router")
#: the host's processes serving every node
HOST_COMPONENTS = ("coredns", "pv-reclaimer")
#: containerd sends image pulls through this proxy: nothing listens there, so a pull of
#: an image that was not imported fails at once instead of reaching for the internet
NO_EGRESS_PROXY = "http://127.0.0.1:9"
REQUIRED_TOOLS = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "ip": "iproute2",
    "mount": "mount",
    "nsenter": "util-linux",
}
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")


@dataclass(frozen=True)
class NodeSpec:
    """One real node: its names and addresses follow from its index."""

    index: int

    @property
    def name(self) -> str:
        return f"mlbench-node-{self.index}"

    @property
    def netns(self) -> str:
        """The node's network namespace (``/run/netns/<name>``)."""
        return self.name

    @property
    def ip(self) -> str:
        """The node's address on the nodes' network (its kubelet, NodePorts, InternalIP)."""
        return f"10.213.0.{11 + self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.213.{1 + self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.213.{1 + self.index}.1"

    @property
    def cgroup_root(self) -> str:
        return f"/{self.name}"

    @property
    def host_veth(self) -> str:
        """The host's end of the node's link (the node's end is its ``eth0``)."""
        return f"mlbn{self.index}"

    def component(self, agent: str) -> str:
        """The process name of one of the node's agents (pid and log files)."""
        return f"{agent}@{self.name}"

    def in_netns(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the node's network namespace (the host's mount namespace)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]


def node_specs(count: int) -> list[NodeSpec]:
    return [NodeSpec(i) for i in range(count)]


#: the first real node (tests that need one node's name)
NODE_NAME = NodeSpec(0).name


def node_count(env: dict[str, str] | None = None) -> int:
    """``MLBENCH_REAL_NODES`` (1 to MAX_NODE_COUNT), default DEFAULT_NODE_COUNT."""
    env = dict(os.environ) if env is None else env
    raw = env.get("MLBENCH_REAL_NODES", "").strip()
    if not raw:
        return DEFAULT_NODE_COUNT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_NODE_COUNT:
        raise ValueError(f"MLBENCH_REAL_NODES={raw!r}: expected a whole number from 1 to {MAX_NODE_COUNT}")
    return int(raw)


@dataclass(frozen=True)
class RealNodeInfo:
    """What tests need to put pods on the real nodes and side-load images into them.

    On the local cluster: ``mlbench-node-0..`` with their taint/label and their containerd
    sockets.  On another real cluster (``MLBENCH_TEST_KUBECONFIG``): the nodes it has, no
    scheduling constraints, containerd only if ``MLBENCH_CONTAINERD_ADDRESS`` says so.
    ``name``, ``containerd_address`` and ``ip`` are the first node's.
    """

    name: str | None
    containerd_address: str | None
    node_selector: dict[str, str] = field(default_factory=lambda: dict(REAL_NODE_LABELS))
    tolerations: list[dict[str, str]] = field(default_factory=lambda: [dict(t) for t in REAL_NODE_TOLERATIONS])
    ip: str | None = NodeSpec(0).ip
    #: every real node's name (one entry per node; empty where they are not known)
    names: tuple[str, ...] = ()
    #: every real node's containerd socket (images are imported into each)
    containerd_addresses: tuple[str, ...] = ()

    def scheduling(self, node: str | None = None) -> dict[str, Any]:
        """Pod-spec fields (``nodeSelector`` + ``tolerations``) that place a pod on a real
        node, or on the one named ``node`` (empty on a cluster where every node is real)."""
        out: dict[str, Any] = {}
        selector = dict(self.node_selector)
        if node is not None:
            selector["kubernetes.io/hostname"] = node
        if selector:
            out["nodeSelector"] = selector
        if self.tolerations:
            out["tolerations"] = [dict(t) for t in self.tolerations]
        return out


# ----------------------------------------------------------------- preflight
def real_node_blocker(env: dict[str, str] | None = None) -> str | None:
    """Why this machine cannot run the real node, or None if it can.

    ``MLBENCH_REAL_NODE=0`` turns it off; the kwok part of the cluster never needs it.
    """
    env = dict(os.environ) if env is None else env
    if env.get("MLBENCH_REAL_NODE", "").strip().lower() in ("0", "false", "no", "off"):
        return "MLBENCH_REAL_NODE=0"
    if os.geteuid() != 0:
        return "not root (a kubelet, containerd and a bridge need root)"
    if env.get("container"):
        return f"inside a {env['container']} container"
    for tool, package in REQUIRED_TOOLS.items():
        if not shutil.which(tool):
            return f"{tool} not found (apt-get install {package})"
    missing = [p for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).exists()]
    if missing:
        return f"CNI plugins {missing} not in {CNI_BIN_DIR} (apt-get install containernetworking-plugins)"
    for binary, package in (("/usr/bin/catatonit", "catatonit"), ("/bin/busybox", "busybox-static")):
        if not Path(binary).exists():
            return f"{binary} not found (apt-get install {package})"
    if not Path("/sys/fs/cgroup/pids").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no usable cgroup hierarchy under /sys/fs/cgroup"
    return None


def real_node_required(env: dict[str, str] | None = None) -> bool:
    """``MLBENCH_REAL_NODE=1``: fail ``up`` instead of running without the real node."""
    env = dict(os.environ) if env is None else env
    return env.get("MLBENCH_REAL_NODE", "").strip().lower() in ("1", "true", "yes", "on")


# ------------------------------------------------------------ config builders
@dataclass(frozen=True)
class NodePaths:
    """Where a node keeps things: state under the cluster dir (wiped freely),
    containerd's root (images, snapshots) under the cache (survives ``down``)."""

    node: NodeSpec
    root: Path  # <cluster dir>/nodes/<name>
    containerd_root: Path  # <cache>/node-containerd-1.6/roots/<name>

    @property
    def containerd_dir(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def containerd_state(self) -> Path:
        return self.containerd_dir / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy-config.yaml"

    @property
    def corefile(self) -> Path:
        return self.root / "Corefile"

    @property
    def resolv_conf(self) -> Path:
        return self.root / "resolv.conf"

    @property
    def images_cache(self) -> Path:
        """The node images' archives, built once for every node."""
        return self.containerd_root.parent.parent / "images"

    def all_dirs(self) -> list[Path]:
        return [
            self.containerd_dir,
            self.containerd_state,
            self.containerd_root,
            self.cni_conf_dir,
            self.cni_ipam_dir,
            self.kubelet_dir,
            self.pod_logs,
        ]


def containerd_config(paths: NodePaths) -> str:
    """containerd 1.6 config: CRI with runc (cgroupfs), overlayfs, our own CNI dirs and
    the locally built pause image.  ``restrict_oom_score_adj`` is required here: without
    it every sandbox fails with runc's "can't get final child's PID from pipe: EOF"."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    unused = [f"io.containerd.snapshotter.v1.{name}" for name in ("btrfs", "zfs", "devmapper", "aufs")]
    return f"""version = 2
root = "{paths.containerd_root}"
state = "{paths.containerd_state}"
disabled_plugins = {json.dumps(unused)}

[grpc]
  address = "{paths.containerd_socket}"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{paths.containerd_dir / "opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  device_ownership_from_security_context = true
  max_concurrent_downloads = 3

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{paths.cni_conf_dir}"
  max_conf_num = 1
"""


def cni_conflist(paths: NodePaths) -> dict[str, Any]:
    """Bridge + host-local IPAM + portmap (containerd adds loopback itself), in the
    node's namespace.  ``ipMasq`` stays off: pods reach other nodes' pods by routes."""
    return {
        "cniVersion": "1.0.0",
        "name": "mlbench",
        "plugins": [
            {
                "type": "bridge",
                "bridge": POD_BRIDGE,
                "isGateway": True,
                "isDefaultGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": paths.node.pod_cidr, "gateway": paths.node.pod_gateway}]],
                    "dataDir": str(paths.cni_ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(paths: NodePaths, pki: Path, port: int, healthz_port: int) -> dict[str, Any]:
    """KubeletConfiguration: x509 + webhook authn/authz, cgroupfs on cgroup v1, our
    containerd, cluster DNS on the bridge, image GC off (imported images cannot be
    pulled again), the real-node taint.  It listens on the node's address (the host reaches
    it there; 127.0.0.1 inside the node's namespace is not the host's)."""
    node = paths.node
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": node.ip,
        "healthzPort": healthz_port,
        "tlsCertFile": str(pki / f"kubelet-serving-{node.name}.crt"),
        "tlsPrivateKeyFile": str(pki / f"kubelet-serving-{node.name}.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True, "cacheTTL": "30s"},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "podLogsDir": str(paths.pod_logs),
        "clusterDNS": [BRIDGE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(paths.resolv_conf),
        "registerWithTaints": [dict(REAL_NODE_TAINT)],
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "failSwapOn": False,
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "shutdownGracePeriodCriticalPods": "0s",
        "maxPods": 110,
        "volumePluginDir": str(paths.root / "volume-plugins"),
        "runtimeRequestTimeout": "2m",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
    }


def kubelet_args(bins: Path, paths: NodePaths, kubeconfig: Path) -> list[str]:
    node = paths.node
    return node.in_netns(
        [
            str(bins / "kubelet"),
            f"--config={paths.kubelet_config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={paths.kubelet_dir}",
            f"--cert-dir={paths.root / 'kubelet-pki'}",
            f"--hostname-override={node.name}",
            f"--node-ip={node.ip}",
            # cAdvisor (the kubelet's /metrics/cadvisor) asks containerd which pod a cgroup belongs to; without
            # our socket it labels nothing with namespace/pod/container and the dashboards' resource panels are empty
            f"--containerd={paths.containerd_socket}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in REAL_NODE_LABELS.items()),
            "--v=1",
        ]
    )


def kube_proxy_config(node: NodeSpec, kubeconfig: Path, healthz_port: int, metrics_port: int) -> dict[str, Any]:
    """iptables mode in the node's namespace (its rules are the node's own); touches no
    conntrack/route_localnet sysctls and opens NodePorts on the node's address only."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": node.name,
        "bindAddress": node.ip,
        "clusterCIDR": CLUSTER_CIDR,
        "healthzBindAddress": f"{node.ip}:{healthz_port}",
        "metricsBindAddress": f"{node.ip}:{metrics_port}",
        "nodePortAddresses": [f"{node.ip}/32"],
        "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def corefile(kubeconfig: Path, ready_port: int) -> str:
    """CoreDNS on the bridge address only, cluster zones only (no upstream: names
    outside the cluster get SERVFAIL, nothing is forwarded off this machine).  No
    ``cache``: a worker's name must resolve as soon as its pod is Ready, and a cached
    NXDOMAIN from a moment before would hide it for the cache's TTL."""
    return f""".:53 {{
    bind {BRIDGE_IP}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} mlbench-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
}}
"""


def coredns_args(bins: Path, corefile_path: Path) -> list[str]:
    return [str(bins / "coredns"), "-conf", str(corefile_path), "-pidfile", ""]


def kube_proxy_args(bins: Path, paths: NodePaths) -> list[str]:
    return paths.node.in_netns([str(bins / "kube-proxy"), f"--config={paths.kube_proxy_config}", "--v=1"])


def kube_router_args(binary: Path, node: NodeSpec, kubeconfig: Path, health_port: int) -> list[str]:
    """kube-router as the node's NetworkPolicy enforcer only (``--run-firewall``: iptables + ipset in the
    node's namespace, filtering what the node forwards to and from its pods): no BGP router (the host-gw
    routes join the pod networks), no IPVS proxy (kube-proxy serves Services), no CNI config of its own.
    Its health endpoint listens on the node's address."""
    return node.in_netns(
        [
            str(binary),
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--enable-cni=false",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={node.name}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--health-port={health_port}",
            "--metrics-port=0",
            "--iptables-sync-period=1m",
            "--v=1",
        ]
    )


def containerd_args(paths: NodePaths) -> list[str]:
    return paths.node.in_netns(["containerd", "--config", str(paths.containerd_config)])


def node_rbac() -> list[dict[str, Any]]:
    """RBAC for the node's agents that the default policy lacks: CoreDNS reads
    Services/EndpointSlices/Pods/Namespaces; kube-router reads what NetworkPolicies select
    (its own ClusterRole, as its manifests give it); the apiserver's kubelet client may call
    the kubelet API (``kubectl logs/exec``)."""
    list_watch = ["list", "watch"]
    rbac = "rbac.authorization.k8s.io"
    read = ["get", "list", "watch"]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "mlbench:kube-router"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
                    "verbs": read,
                },
                {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": read},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "mlbench:kube-router"},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "mlbench:kube-router"},
            "subjects": [{"apiGroup": rbac, "kind": "User", "name": "mlbench:kube-router"}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "mlbench:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": list_watch},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": list_watch},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "mlbench:coredns"},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "mlbench:coredns"},
            "subjects": [{"apiGroup": rbac, "kind": "User", "name": "mlbench:coredns"}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "mlbench:apiserver-kubelet-client"},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
            "subjects": [{"apiGroup": rbac, "kind": "User", "name": "kube-apiserver-kubelet-client"}],
        },
    ]


def storage_objects(pv_dir: Path, nodes: Sequence[NodeSpec], count: int = LOCAL_PV_COUNT) -> list[dict[str, Any]]:
    """Default StorageClass ``standard`` (no provisioner, WaitForFirstConsumer, as a
    kind cluster has one) and ``count`` local PVs on each real node."""
    sc = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    }
    shared = {**sc, "metadata": {"name": SHARED_STORAGE_CLASS}}
    return [
        sc,
        shared,
        *(local_pv(node, i, pv_dir / pv_dir_name(node, i)) for node in nodes for i in range(count)),
        *(shared_pv(i, pv_dir / f"shared-{i}") for i in range(SHARED_PV_COUNT)),
    ]


def pv_dir_name(node: NodeSpec, index: int) -> str:
    return f"n{node.index}-pv-{index}"


def local_pv(node: NodeSpec, index: int, path: Path) -> dict[str, Any]:
    """A ``local`` PV on ``node``; Retain, and the cluster's pv-reclaimer wipes and frees it
    once released (what the local static provisioner does in real clusters)."""
    on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node.name]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"mlbench-local-n{node.index}-{index}",
            "labels": {LOCAL_PV_LABEL: "true"},
        },
        "spec": {
            "capacity": {"storage": LOCAL_PV_SIZE},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "local": {"path": str(path)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}},
        },
    }


def shared_pv(index: int, path: Path) -> dict[str, Any]:
    """A ReadWriteMany PV that every real node mounts: a directory of this machine, which all
    the nodes share (the role an NFS export plays in a real cluster); no node affinity."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"mlbench-shared-{index}", "labels": {LOCAL_PV_LABEL: "true"}},
        "spec": {
            "capacity": {"storage": LOCAL_PV_SIZE},
            "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": SHARED_STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "hostPath": {"path": str(path), "type": "Directory"},
        },
    }


def prepare_pv_dirs(pv_dir: Path, nodes: Sequence[NodeSpec], count: int = LOCAL_PV_COUNT) -> None:
    """Fresh, empty, world-writable directories (pods run as any uid); none left of a
    node that this ``up`` does not start."""
    wipe_dir_contents(pv_dir)
    names = [pv_dir_name(node, i) for node in nodes for i in range(count)]
    for name in names + [f"shared-{i}" for i in range(SHARED_PV_COUNT)]:
        d = pv_dir / name
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o777)


def wipe_dir_contents(d: Path) -> None:
    """Empty ``d`` without crossing into anything mounted below it."""
    if not d.is_dir():
        return
    for child in d.iterdir():
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(child)], check=False)


# ------------------------------------------------------------ host operations
def _run(*argv: str, timeout: float = 20, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=check)


def bridge_up() -> None:
    """Create the bridge with the gateway address (idempotent)."""
    if _run("ip", "link", "show", BRIDGE).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge", check=True)
    _run("ip", "addr", "replace", f"{BRIDGE_IP}/24", "dev", BRIDGE, check=True)
    _run("ip", "link", "set", BRIDGE, "up", check=True)


def bridge_down() -> None:
    _run("ip", "link", "del", BRIDGE)


def node_network_commands(node: NodeSpec, nodes: Sequence[NodeSpec]) -> list[list[str]]:
    """The ``ip`` commands that make ``node``'s namespace, its link to the host bridge,
    its address and the routes: default via the host, each other node's pod CIDR via
    that node (host-gw), and on the host this node's pod CIDR via this node."""
    ns = node.netns
    cmds = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", node.host_veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["ip", "link", "set", node.host_veth, "master", BRIDGE, "up"],
        ["ip", "-n", ns, "addr", "add", f"{node.ip}/24", "dev", "eth0"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", BRIDGE_IP],
    ]
    cmds += [["ip", "-n", ns, "route", "add", other.pod_cidr, "via", other.ip] for other in nodes if other != node]
    cmds.append(["ip", "route", "replace", node.pod_cidr, "via", node.ip, "dev", BRIDGE])
    return cmds


def node_network_up(node: NodeSpec, nodes: Sequence[NodeSpec]) -> None:
    """Make the node's namespace and routes (after ``bridge_up``); forwarding on inside
    it (the node routes its pods' traffic), not on the host."""
    node_network_down(node)
    for cmd in node_network_commands(node, nodes):
        _run(*cmd, check=True)
    _run(*node.in_netns(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]), check=True)


def node_network_down(node: NodeSpec) -> None:
    """Delete the node's namespace: its link, its pod bridge and its iptables go with it."""
    _run("ip", "netns", "delete", node.netns)
    _run("ip", "link", "del", node.host_veth)


def node_link(node: NodeSpec, up: bool) -> None:
    """Plug the node's cable in or out: the host end of its veth, up or down."""
    _run("ip", "link", "set", node.host_veth, "up" if up else "down", check=True)


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def isolation_rules() -> list[list[str]]:
    """Rules of our FORWARD guard: node <-> node on the bridge is fine; anything routed
    between the bridge and another interface is dropped."""
    return [
        ["-i", BRIDGE, "-o", BRIDGE, "-j", "RETURN"],
        ["-i", BRIDGE, "-j", "DROP"],
        ["-o", BRIDGE, "-j", "DROP"],
    ]


#: Tables holding the guard: mangle's FORWARD runs before filter's and nothing accepts there, so
#: whatever another program puts in the filter table cannot bypass it.
ISOLATION_TABLES = ("mangle", "filter")


def isolation_up() -> None:
    """Install the guard chain (rebuilt from scratch).  The host's own forwarding switch
    is left as it is: pods reach each other through the bridge, and the host itself only
    as an end (the apiserver, CoreDNS)."""
    isolation_down()
    for table in ISOLATION_TABLES:
        _run("iptables", "-w", "-t", table, "-N", ISOLATION_CHAIN, check=True)
        for rule in isolation_rules():
            _run("iptables", "-w", "-t", table, "-A", ISOLATION_CHAIN, *rule, check=True)
        _run("iptables", "-w", "-t", table, "-I", "FORWARD", "1", "-j", ISOLATION_CHAIN, check=True)


def isolation_down() -> None:
    for table in ISOLATION_TABLES:
        for _ in range(10):
            if _run("iptables", "-w", "-t", table, "-D", "FORWARD", "-j", ISOLATION_CHAIN).returncode != 0:
                break
        _run("iptables", "-w", "-t", table, "-F", ISOLATION_CHAIN)
        _run("iptables", "-w", "-t", table, "-X", ISOLATION_CHAIN)


def ctr(address: Path, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ctr`` against the node's containerd, in the CRI namespace."""
    res = subprocess.run(
        [ctr_bin(), "--address", str(address), "--namespace", "k8s.io", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and res.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def image_labels(address: Path, name: str) -> dict[str, str] | None:
    """Labels of image ``name`` in the node's containerd, None if it is not there."""
    res = ctr(address, "images", "ls", f"name=={name}", check=False, timeout=15)
    lines = [ln for ln in res.stdout.splitlines()[1:] if ln.split() and ln.split()[0] == name]
    if res.returncode != 0 or not lines:
        return None
    labels_col = lines[0].split()[-1]
    out: dict[str, str] = {}
    for item in labels_col.split(","):
        if "=" in item:
            k, v = item.split("=", 1)
            out[k] = v
    return out


def import_image(address: Path, archive: Path, timeout: float = 1800) -> list[str]:
    """Import a docker-archive or OCI tar into the node's containerd (namespace
    k8s.io, unpacked for overlayfs) and return the image names it brought."""
    if not archive.is_file():
        raise FileNotFoundError(f"image archive {archive} does not exist")
    res = ctr(address, "images", "import", "--all-platforms", str(archive), timeout=timeout, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"importing {archive} into {address} failed: {res.stderr.strip() or res.stdout.strip()}")
    names = []
    for line in (res.stdout + "\n" + res.stderr).splitlines():
        # ctr prints "unpacking <name> (sha256:...)...done"
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "unpacking":
            names.append(parts[1])
    return names


def ensure_node_images(address: Path, cache: Path) -> dict[str, float]:
    """Build (once) and import (once per containerd root) the pause and busybox
    images; an image is re-imported only when its archive changed (label check)."""
    took: dict[str, float] = {}
    for name in (PAUSE_IMAGE, BUSYBOX_IMAGE):
        t0 = time.monotonic()
        archive, key = build_archive(name, cache)
        if (image_labels(address, name) or {}).get("mlbench.io/archive") != key:
            import_image(address, archive, timeout=120)
            ctr(address, "images", "label", name, f"mlbench.io/archive={key}", timeout=15)
        took[name] = round(time.monotonic() - t0, 2)
    return took


def remove_all_containers(address: Path, timeout: float = 30) -> None:
    """Kill and delete every task and container of the CRI namespace (the kubelet is
    already stopped; the API objects are wiped with etcd anyway)."""
    tasks = ctr(address, "tasks", "ls", "-q", check=False, timeout=timeout).stdout.split()
    if tasks:
        ctr(address, "tasks", "delete", "--force", *tasks, check=False, timeout=timeout)
    containers = ctr(address, "containers", "ls", "-q", check=False, timeout=timeout).stdout.split()
    if containers:
        ctr(address, "containers", "delete", *containers, check=False, timeout=timeout)


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def shim_pids(address: Path) -> list[int]:
    """containerd shims started by OUR containerd (their ``-address`` is our socket)."""
    out = []
    for pid in _pids():
        argv = _cmdline(pid)
        if argv and argv[0].endswith("containerd-shim-runc-v2") and str(address) in argv:
            out.append(pid)
    return out


def cgroup_dirs(root: str) -> list[Path]:
    """The node's cgroup root in every mounted hierarchy (v1 controllers + unified)."""
    base = Path("/sys/fs/cgroup")
    rel = root.lstrip("/")
    out = []
    if (base / "cgroup.controllers").exists():  # pure cgroup v2
        out.append(base / rel)
    else:
        out += [d / rel for d in base.iterdir() if d.is_dir() and not d.is_symlink()]
    return [d for d in out if d.is_dir()]


def ensure_cgroup_root(root: str) -> None:
    """The kubelet wants its cgroupRoot to exist in every hierarchy (cgroup v1);
    a new cpuset cgroup is unusable until it has cpus and mems (copied from /)."""
    base = Path("/sys/fs/cgroup")
    rel = root.lstrip("/")
    hierarchies = [base] if (base / "cgroup.controllers").exists() else [d for d in base.iterdir() if d.is_dir()]
    for h in hierarchies:
        if not (h / "cgroup.procs").exists():
            continue  # not a cgroup mount
        d = h / rel
        d.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            # cgroup v2's root has only cpuset.*.effective; v1's has the plain files
            source = next((p for p in (h / name, h / f"{name}.effective") if p.exists()), None)
            if source is not None and (d / name).exists() and not (d / name).read_text().strip():
                (d / name).write_text(source.read_text())


def cgroup_pids(root: str) -> set[int]:
    pids: set[int] = set()
    for d in cgroup_dirs(root):
        # os.walk skips a cgroup removed while it walks (a container exiting); Path.rglob raised FileNotFoundError
        for parent, _dirs, files in os.walk(d):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(x) for x in (Path(parent) / "cgroup.procs").read_text().split())
    return pids


def kill_node_processes(address: Path, root: str, timeout: float = 10) -> None:
    """SIGKILL what containers left behind: every process in the node's cgroups, then
    our shims; wait until they are gone."""
    deadline = time.monotonic() + timeout
    while True:
        victims = cgroup_pids(root) | set(shim_pids(address))
        if not victims or time.monotonic() > deadline:
            return
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_cgroups(root: str) -> None:
    """rmdir the node's (now empty) cgroup trees, deepest first."""
    for d in cgroup_dirs(root):
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            d.rmdir()


def mounts_under(prefixes: Sequence[Path]) -> list[str]:
    """Mount points at or below any of ``prefixes`` (deepest first)."""
    roots = [str(p.resolve()) for p in prefixes]
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if any(mp == r or mp.startswith(r + "/") for r in roots):
            out.append(mp)
    return sorted(set(out), key=len, reverse=True)


def unmount_all(prefixes: Sequence[Path]) -> list[str]:
    """Unmount everything below ``prefixes`` (pod volumes, rootfs, shm); returns
    what could not be unmounted."""
    left = []
    for mp in mounts_under(prefixes):
        if _run("umount", mp).returncode != 0 and _run("umount", "-l", mp).returncode != 0:
            left.append(mp)
    return left


def pod_netns() -> list[str]:
    """Network namespaces the CRI created for pods of our nodes (an address in
    CLUSTER_CIDR), e.g. left behind when sandboxes were killed without CNI teardown."""
    netns_dir = Path("/run/netns")
    if not netns_dir.is_dir():
        return []
    prefix = CLUSTER_CIDR.split(".0.0/", maxsplit=1)[0] + "."
    out = []
    for ns in sorted(netns_dir.iterdir()):
        if not ns.name.startswith("cni-"):
            continue
        res = _run("ip", "-n", ns.name, "-4", "-o", "addr", "show", timeout=5)
        if res.returncode == 0 and f" {prefix}" in res.stdout:
            out.append(ns.name)
    return out


def remove_pod_netns() -> None:
    for name in pod_netns():
        _run("ip", "netns", "delete", name, timeout=5)


def host_cleanup(nodes: Sequence[NodePaths], ipam_dirs: Sequence[Path] = ()) -> list[str]:
    """Undo everything the nodes did to this machine, whatever state they crashed in:
    only what ``up`` made (the namespaces, the bridge, our guard chain, our cgroups and
    mounts); the host's own iptables tables, kubelets and IPVS are never touched.
    Returns the problems it could not fix (mounts that stayed)."""
    left: list[str] = []
    for paths in nodes:
        kill_node_processes(paths.containerd_socket, paths.node.cgroup_root)
        left += unmount_all([paths.root, paths.containerd_root])
    remove_pod_netns()
    for paths in nodes:
        node_network_down(paths.node)
        remove_cgroups(paths.node.cgroup_root)
        subprocess.run(["rm", "-rf", "--one-file-system", str(paths.cni_ipam_dir)], check=False)
    isolation_down()
    bridge_down()
    return left


def ready_condition(node: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True"


def has_real_node_taint(node: dict[str, Any]) -> bool:
    taints = node.get("spec", {}).get("taints") or []
    return any(t.get("key") == REAL_NODE_KEY and t.get("effect") == "NoSchedule" for t in taints)


def write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
