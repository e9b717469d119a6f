"""A real, local Kubernetes control plane for tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (fake nodes, simulated pods),
plus, when run as root, ONE real node (``tests/cluster/node.py``: containerd,
kubelet, kube-proxy, CoreDNS on the bridge ``mlbench0``).

Why: the operator must be exercised against the real API server (OpenAPI and
CEL validation, RBAC, scheduling, garbage collection) at scale (kwok) and with
pods that really run (the real node).  etcd, controller-manager, scheduler and
kwok listen on 127.0.0.1; the kube-apiserver listens on the bridge address
10.213.0.1 when the real node runs (pods must reach it), else on 127.0.0.1.

Binaries come from ``tests/cluster/build-k8s.sh`` (built from Go modules and
cached per version).  State lives in ``$MLBENCH_CACHE/cluster`` (default
``~/.cache/mlbench/cluster``): certificates, kubeconfigs, logs and pid files;
etcd's data lives in /dev/shm and is wiped by ``down``.

Stdlib + PyYAML only at import time, so ``python -m tests.cluster up`` works
from a bare interpreter.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from tests.cluster import node as rn

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-k8s.sh"
#: the NetworkPolicy enforcer's build (kube-router), cached by its own version
NETPOL_BUILD_SCRIPT = HERE / "build-netpol.sh"
STAGES_FILE = HERE / "kwok-stages.yaml"
HOST = "127.0.0.1"
SERVICE_CIDR = rn.SERVICE_CIDR
SERVICE_IP = "10.96.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
#: order matters: started left to right, stopped right to left
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
#: components that are not a binary named like themselves: a marker in their argv
ARGV_MARKERS = {"pv-reclaimer": "tests.cluster.pvreclaim"}
#: bump when the certificates change (new SANs, new identities): the PKI is remade
PKI_VERSION = "4-kube-router"
#: who runs this machine's real nodes (there is one bridge and one 10.213.0.1)
REAL_NODE_OWNER = Path("/run/mlbench-real-node.owner")


def cache_root() -> Path:
    """Root of all MLBench caches (``$MLBENCH_CACHE`` or ``~/.cache/mlbench``)."""
    env = os.environ.get("MLBENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mlbench"


def default_cluster_dir() -> Path:
    return cache_root() / "cluster"


def bin_dir() -> Path:
    """Versioned binary dir; the build script owns the version key."""
    override = os.environ.get("MLBENCH_K8S_BIN_DIR")
    if override:
        return Path(override)
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-bin-dir"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def ensure_binaries() -> Path:
    """Build (or reuse) the control-plane binaries; return their directory."""
    if os.environ.get("MLBENCH_K8S_BIN_DIR"):
        return bin_dir()
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def netpol_binary() -> Path:
    """Build (or reuse) kube-router, the real nodes' NetworkPolicy enforcer; return its path."""
    out = subprocess.run(["bash", str(NETPOL_BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1]) / "kube-router"


def kubectl_path() -> Path:
    return bin_dir() / "kubectl"


def _runner_world() -> ModuleType:
    """The runner's ``world`` module, loaded from its file: stdlib only, and ``python -m tests.cluster`` may run
    where ``mlbench_runner`` is not importable."""
    path = HERE.parent.parent / "runners" / "mlbench_runner" / "world.py"
    spec = importlib.util.spec_from_file_location("mlbench_cluster_world", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_WORLD = _runner_world()
#: ports this process has handed out: a port chosen but not yet bound still looks free
_HANDED_OUT: set[int] = set()


def free_port(host: str = HOST) -> int:
    """A TCP port free on ``host`` now, outside the kernel's ephemeral range, and not handed out before.

    Why not ``bind(0)``: that gives an ephemeral port, which an outgoing connection (kubectl, a component's
    client of etcd or the API server) can be given before the component binds it; the runner's chooser
    (``mlbench_runner.world.free_port``) picks below that range. The choice is random, so ports handed out
    by this process (a cluster's components are bound only when they start) are skipped.
    """
    for _ in range(100):
        port = int(_WORLD.free_port([host]))
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port on {host} that this process has not handed out already")


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


# Nodes: two CPU nodes and two 8-GPU nodes.  pods=1100 each so a 1000-worker
# scale test fits on one node and 4400 pods fit in total.
@dataclass(frozen=True)
class FakeNode:
    name: str
    cpu: str
    memory: str
    zone: str
    instance_type: str
    gpus: int = 0
    pods: str = "1100"
    #: reported InternalIP (documentation only; nothing is ever sent to it)
    internal_ip: str = ""

    def manifest(self) -> dict[str, Any]:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": self.instance_type,
            "topology.kubernetes.io/zone": self.zone,
            "topology.kubernetes.io/region": "local",
            "type": "kwok",
        }
        resources: dict[str, str] = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods,
            "ephemeral-storage": "500Gi",
        }
        if self.gpus:
            labels["nvidia.com/gpu.present"] = "true"
            labels["nvidia.com/gpu.count"] = str(self.gpus)
            resources["nvidia.com/gpu"] = str(self.gpus)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": labels,
                "annotations": {
                    KWOK_NODE_ANNOTATION: "fake",
                    "node.alpha.kubernetes.io/ttl": "0",
                },
            },
            "spec": {},
            "status": {
                "capacity": resources,
                "allocatable": dict(resources),
                "addresses": [
                    {"type": "InternalIP", "address": self.internal_ip},
                    {"type": "Hostname", "address": self.name},
                ],
            },
        }


DEFAULT_NODES: tuple[FakeNode, ...] = (
    FakeNode("kwok-cpu-0", "16", "64Gi", "zone-a", "mlbench.cpu16", internal_ip="10.250.0.1"),
    FakeNode("kwok-cpu-1", "16", "64Gi", "zone-b", "mlbench.cpu16", internal_ip="10.250.0.2"),
    FakeNode("kwok-gpu-0", "32", "128Gi", "zone-a", "mlbench.gpu8", gpus=8, internal_ip="10.250.0.3"),
    FakeNode("kwok-gpu-1", "32", "128Gi", "zone-b", "mlbench.gpu8", gpus=8, internal_ip="10.250.0.4"),
)


@dataclass
class LocalCluster:
    """Lifecycle of the local cluster rooted at ``root``.

    ``up()`` is idempotent (a healthy running cluster is reused) and
    ``down()`` is safe to call repeatedly, also after a crash.
    """

    root: Path = field(default_factory=default_cluster_dir)
    nodes: Sequence[FakeNode] = DEFAULT_NODES
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False, repr=False)

    # ------------------------------------------------------------------ paths
    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def node_paths(self, node: rn.NodeSpec) -> rn.NodePaths:
        """A real node's dirs: state here, containerd's image store in the cache
        (a 6 GB runner image is imported once per node and survives ``down``)."""
        return rn.NodePaths(
            node, self.root / "nodes" / node.name, cache_root() / "node-containerd-1.6" / "roots" / node.name
        )

    @property
    def pv_dir(self) -> Path:
        """Every real node's local PV directories (one filesystem: the nodes share this machine)."""
        return self.root / "pv"

    def real_node_specs(self) -> list[rn.NodeSpec]:
        """The running cluster's real nodes (none when it runs without them)."""
        node = self.state().get("real_node") or {}
        return rn.node_specs(len(node.get("names", [])))

    def _node_components(self, nodes: Sequence[rn.NodeSpec]) -> tuple[str, ...]:
        agents = tuple(node.component(agent) for node in nodes for agent in rn.NODE_AGENTS)
        return (*agents, *rn.HOST_COMPONENTS) if nodes else ()

    @property
    def etcd_data(self) -> Path:
        """etcd data on tmpfs when available: fast and never persisted."""
        tag = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:10]
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.root
        return base / f"mlbench-etcd-{os.getuid()}-{tag}"

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise up/down between concurrent callers (e.g. two pytest runs)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # --------------------------------------------------------------- public
    def up(self, timeout: float = 180.0) -> bool:
        """Start the cluster; return True if this call started it, False if
        a healthy one was already running."""
        with self._lock():
            if self._running_and_healthy() and not self._lacks_a_required_node():
                return False
            self._stop_all()
            bins = ensure_binaries()
            try:
                self._start(bins, timeout)
            except BaseException:
                self._stop_all()
                raise
            return True

    def down(self) -> None:
        """Stop every component this cluster dir started, remove the real node's
        containers, mounts, netns, iptables chains and bridge, wipe etcd data."""
        with self._lock():
            self._stop_all()

    def status(self) -> dict[str, bool]:
        names = COMPONENTS + self._node_components(self.real_node_specs())
        return {c: self._pid_alive(c) is not None for c in names}

    def is_up(self) -> bool:
        with self._lock():
            return self._running_and_healthy()

    def state(self) -> dict[str, Any]:
        """state.json of the running cluster ({} when down)."""
        try:
            return dict(json.loads(self.state_file.read_text()))
        except (OSError, ValueError):
            return {}

    def real_node(self) -> rn.RealNodeInfo | None:
        """The running cluster's real nodes, or None (see ``real_node_reason``)."""
        node = self.state().get("real_node")
        if not node:
            return None
        return rn.RealNodeInfo(
            name=node["name"],
            containerd_address=node["containerd_address"],
            ip=node["ip"],
            names=tuple(node["names"]),
            containerd_addresses=tuple(node["containerd_addresses"]),
        )

    def ensure_node_images(self) -> None:
        """Import the nodes' own images (pause, busybox) where they are missing again: a kubelet under disk pressure
        (this machine's disk, shared by every node and the image builds) garbage-collects even the pause image, and
        nothing can pull it back."""
        for node in self.real_node_specs():
            paths = self.node_paths(node)
            rn.ensure_node_images(paths.containerd_socket, paths.images_cache)

    def lose_node(self, name: str) -> None:
        """Make real node ``name`` vanish as a machine that lost power does: its link goes down (packets to it are
        dropped: its peers see silence, not a reset), its agents stop and every process of its containers dies.
        The API server still lists its pods as they were, until the node lifecycle controller notices."""
        node = self._real_node_spec(name)
        rn.node_link(node, up=False)
        try:  # whatever fails on the way, containerd goes too: restore_node starts a fresh one
            for agent in ("kube-router", "kubelet", "kube-proxy"):
                self._stop_component(node.component(agent), grace=2.0)
            rn.kill_node_processes(self.node_paths(node).containerd_socket, node.cgroup_root)
        finally:
            self._stop_component(node.component("containerd"), grace=5.0)

    def restore_node(self, name: str, timeout: float = 120.0) -> None:
        """Bring a lost node back as a rebooted machine: its link up, then containerd, kube-proxy, the kubelet and
        kube-router again (new ports, kept in state.json); returns once the Node is Ready and kube-router healthy.
        What its kubelet finds of the pods it ran before is its to clean up, as on a real reboot."""
        node = self._real_node_spec(name)
        state = self.state()
        bins = Path(state["bin_dir"])
        rn.node_link(node, up=True)
        self._start_containerd(node)
        sock = self.node_paths(node).containerd_socket
        deadline = time.monotonic() + timeout
        self._wait(lambda: rn.ctr(sock, "version", check=False, timeout=5).returncode == 0, deadline, "containerd")
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        ports = self._start_node_agents(bins, state["server"], node, env)
        self._wait(lambda: self._real_node_ready(bins, node), deadline, f"real node {name} Ready again")
        kc = self.root / "kubeconfigs" / "kube-router.kubeconfig"
        router = rn.kube_router_args(netpol_binary(), node, kc, ports["kube_router_health_port"])
        self._spawn(node.component("kube-router"), router, env=env)
        health = f"http://{node.ip}:{ports['kube_router_health_port']}/healthz"
        self._wait(lambda: self._get_ok(health, tls=False), deadline, f"kube-router of {name} healthy")
        state["nodes"][name] = ports
        self.state_file.write_text(json.dumps(state, indent=2))

    def _real_node_spec(self, name: str) -> rn.NodeSpec:
        node = next((n for n in self.real_node_specs() if n.name == name), None)
        if node is None:
            raise ValueError(f"no real node {name!r} in this cluster ({[n.name for n in self.real_node_specs()]})")
        return node

    def real_node_reason(self) -> str:
        """Why the running cluster has no real node ("" when it has one)."""
        return str(self.state().get("real_node_reason", "cluster is not running"))

    def import_image(self, archive: Path) -> list[str]:
        """Import a docker-archive/OCI tar into every real node's containerd (kept
        across ``down``/``up``); returns the image names imported."""
        node = self.real_node()
        if node is None or not node.containerd_addresses:
            raise RuntimeError(f"no real node to import {archive} into: {self.real_node_reason()}")
        names: list[str] = []
        for address in node.containerd_addresses:
            names = rn.import_image(Path(address), archive)
        return names

    # ------------------------------------------------------------- internals
    def _running_and_healthy(self) -> bool:
        if not self.state_file.exists() or not self.kubeconfig.exists():
            return False
        state = self.state()
        names = COMPONENTS + self._node_components(self.real_node_specs())
        if not all(self._pid_alive(c) for c in names):
            return False
        return "server" in state and self._get_ok(f"{state['server']}/readyz")

    def _pid_alive(self, component: str) -> int | None:
        """PID of a running component we started (checked via /proc cmdline so
        a recycled pid is never mistaken for ours)."""
        pidfile = self.pids / f"{component}.pid"
        try:
            pid = int(pidfile.read_text().strip())
            for _ in range(40):  # cmdline reads empty for a moment around exec()
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                if raw:
                    break
                time.sleep(0.025)
            cmdline = raw.split(b"\0")
        except (OSError, ValueError):
            return None
        marker = ARGV_MARKERS.get(component)
        binary = component.split("@", maxsplit=1)[0]  # a node's agent: "kubelet@mlbench-node-1"
        if marker is not None:
            if marker.encode() not in cmdline:
                return None
        elif not cmdline or not cmdline[0].endswith(binary.encode()):
            return None
        if str(self.root).encode() not in b" ".join(cmdline):
            return None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                return None
        except OSError:
            return None
        return pid

    def restart_component(self, component: str, timeout: float = 120.0) -> float:
        """Stop one running control-plane component (SIGTERM, as a kubelet restarting a static pod) and start
        it again with the same command line; returns the seconds until it was back (the kube-apiserver:
        ``/readyz`` answers)."""
        pid = self._pid_alive(component)
        if pid is None:
            raise RuntimeError(f"{component} is not running in {self.root}")
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        t0 = time.monotonic()
        self._stop_component(component, grace=10.0)
        self._spawn(component, argv)
        if component == "kube-apiserver":
            self._wait(lambda: self._get_ok(f"{self.state()['server']}/readyz"), t0 + timeout, component)
        return time.monotonic() - t0

    def _stop_component(self, component: str, grace: float) -> None:
        """Stop one component; a process this object spawned is forgotten too, so that waits that watch for
        components exiting (``_wait``) no longer count it."""
        pid = self._pid_alive(component)
        if pid is not None:
            self._terminate(pid, grace)
        self._procs.pop(component, None)
        (self.pids / f"{component}.pid").unlink(missing_ok=True)

    def _nodes_left_behind(self) -> list[rn.NodeSpec]:
        """Every real node this cluster dir may have started: those of its state, of its
        node dirs, and any whose namespace is still there (after a crash)."""
        dirs = {p.name for p in (self.root / "nodes").glob("mlbench-node-*")}
        specs = rn.node_specs(rn.MAX_NODE_COUNT)
        return [n for n in specs if n.name in dirs or rn.netns_exists(n.netns)] or self.real_node_specs()

    def _stop_all(self) -> None:
        nodes = self._nodes_left_behind()
        node_was_here = self._owns_real_node() or (bool(nodes) and os.geteuid() == 0)
        # the nodes first: the host's agents, then each node's kubelet and kube-proxy, every container, containerd
        for component in reversed(rn.HOST_COMPONENTS):
            self._stop_component(component, grace=5.0)
        for node in nodes:
            for agent in ("kube-router", "kubelet", "kube-proxy"):
                self._stop_component(node.component(agent), grace=5.0)
            if self._pid_alive(node.component("containerd")) is not None:
                with contextlib.suppress(subprocess.TimeoutExpired, RuntimeError, FileNotFoundError):
                    rn.remove_all_containers(self.node_paths(node).containerd_socket, timeout=20)
            self._stop_component(node.component("containerd"), grace=5.0)
        for component in reversed(COMPONENTS):
            self._stop_component(component, grace=10.0)
        for proc in self._procs.values():
            with contextlib.suppress(ChildProcessError, OSError):
                proc.poll()
        self._procs.clear()
        if node_was_here and rn.real_node_blocker({}) is None and self._may_touch_real_node():
            all_paths = [self.node_paths(node) for node in nodes]
            left = rn.host_cleanup(all_paths)
            if left:
                print(f"warning: could not unmount {left}", file=sys.stderr)
            for paths in all_paths:
                for d in ("containerd/state", "kubelet/pods", "kubelet/plugins", "containerd/opt"):
                    subprocess.run(["rm", "-rf", "--one-file-system", str(paths.root / d)], check=False)
            if self._owns_real_node():
                REAL_NODE_OWNER.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(self.etcd_data)], check=False)
        self.state_file.unlink(missing_ok=True)

    def _owns_real_node(self) -> bool:
        try:
            return REAL_NODE_OWNER.read_text().strip() == str(self.root.resolve())
        except OSError:
            return False

    def _may_touch_real_node(self) -> bool:
        """True unless ANOTHER cluster dir runs this machine's real node right now."""
        try:
            owner = REAL_NODE_OWNER.read_text().strip()
        except OSError:
            return True
        if owner == str(self.root.resolve()):
            return True
        other = LocalCluster(root=Path(owner))
        agents = [n.component(a) for n in rn.node_specs(rn.MAX_NODE_COUNT) for a in ("containerd", "kubelet")]
        return not any(other._pid_alive(c) for c in agents)

    @staticmethod
    def _terminate(pid: int, grace: float = 10.0) -> None:
        """SIGTERM the component's process group (it is a session leader we
        created), then SIGKILL after ``grace`` seconds."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                    if done == pid:
                        return
                except ChildProcessError:
                    # not our child (started by another `up`): poll /proc
                    if not Path(f"/proc/{pid}").exists():
                        return
                    stat = Path(f"/proc/{pid}/stat")
                    with contextlib.suppress(OSError):
                        if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                            return
                time.sleep(0.05)

    def _spawn(self, component: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{component}.log", "ab")  # noqa: SIM115 - owned by the child
        log.write(f"\n==== {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.root,
            env=env,
        )
        log.close()
        self._procs[component] = proc
        (self.pids / f"{component}.pid").write_text(f"{proc.pid}\n")

    def _lacks_a_required_node(self) -> bool:
        """MLBENCH_REAL_NODE=1 and the running cluster was started without the real node (an earlier
        kwok-only session's): it is started again, with the node or failing with the reason."""
        return rn.real_node_required() and self.real_node() is None

    def _real_node_plan(self) -> str | None:
        """None if this ``up`` runs the real node, else why not (logged, kept in
        state.json); raises if MLBENCH_REAL_NODE=1 and it cannot."""
        reason = rn.real_node_blocker()
        if reason is None and not self._may_touch_real_node():
            reason = f"this machine's real node belongs to the running cluster {REAL_NODE_OWNER.read_text().strip()}"
        if reason is not None and rn.real_node_required():
            raise RuntimeError(f"MLBENCH_REAL_NODE=1 but no real node possible: {reason}")
        return reason

    def _start(self, bins: Path, timeout: float) -> None:
        t0 = time.monotonic()
        deadline = t0 + timeout
        self.root.mkdir(parents=True, exist_ok=True)
        self._ensure_pki()
        no_node_reason = self._real_node_plan()
        with_node = no_node_reason is None
        nodes = rn.node_specs(rn.node_count()) if with_node else []
        if with_node:
            REAL_NODE_OWNER.write_text(f"{self.root.resolve()}\n")
            rn.bridge_up()
            rn.isolation_up()
            for node in nodes:
                rn.node_network_up(node, nodes)
                self._start_containerd(node)
        else:
            print(f"local cluster: no real node ({no_node_reason}); kwok nodes only", file=sys.stderr)
        api_host = rn.BRIDGE_IP if with_node else HOST
        ports = {
            "etcd_client_port": free_port(),
            "etcd_peer_port": free_port(),
            "apiserver_port": free_port(api_host),
            "controller_manager_port": free_port(),
            "scheduler_port": free_port(),
            "kwok_port": free_port(),
        }
        api = f"https://{api_host}:{ports['apiserver_port']}"
        self._write_kubeconfigs(api)
        etcd_url = f"http://{HOST}:{ports['etcd_client_port']}"
        peer_url = f"http://{HOST}:{ports['etcd_peer_port']}"
        subprocess.run(["rm", "-rf", str(self.etcd_data)], check=False)
        self.etcd_data.mkdir(parents=True, mode=0o700)
        pki = self.pki
        kc = self.root / "kubeconfigs"

        self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=default",
                f"--data-dir={self.etcd_data}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
                # marker so _pid_alive can tell our etcd from anyone else's
                f"--initial-cluster-token=mlbench-{self.root}",
            ],
        )
        self._wait(lambda: self._get_ok(f"{etcd_url}/health", tls=False), deadline, "etcd")

        self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={api_host}",
                f"--advertise-address={api_host}",
                f"--secure-port={ports['apiserver_port']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={pki}",
                "--v=1",
            ],
        )
        self._wait(lambda: self._get_ok(f"{api}/readyz"), deadline, "kube-apiserver")

        self._spawn(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={kc / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={kc / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={kc / 'controller-manager.kubeconfig'}",
                f"--bind-address={HOST}",
                f"--secure-port={ports['controller_manager_port']}",
                "--leader-elect=false",
                "--controllers=*,-nodeipam,-bootstrapsigner,-tokencleaner",
                # each controller acts as its own ServiceAccount, so the default
                # RBAC roles (system:controller:*) apply, as in kubeadm clusters
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--node-monitor-grace-period=60s",
                "--concurrent-gc-syncs=20",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={kc / 'scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={kc / 'scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={kc / 'scheduler.kubeconfig'}",
                f"--bind-address={HOST}",
                f"--secure-port={ports['scheduler_port']}",
                "--leader-elect=false",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
        )
        self._spawn(
            "kwok",
            [
                str(bins / "kwok"),
                f"--kubeconfig={kc / 'kwok.kubeconfig'}",
                f"--config={STAGES_FILE}",
                # only the fake nodes (annotated): the real node has a kubelet
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--server-address={HOST}:{ports['kwok_port']}",
                "--node-lease-duration-seconds=40",
            ],
        )
        state: dict[str, Any] = {
            **ports,
            "server": api,
            "bin_dir": str(bins),
            "started": time.time(),
            "real_node": None,
            "real_node_reason": no_node_reason or "",
        }
        self.state_file.write_text(json.dumps(state, indent=2))

        cm = f"https://{HOST}:{ports['controller_manager_port']}/healthz"
        sched = f"https://{HOST}:{ports['scheduler_port']}/healthz"
        self._wait(lambda: self._get_ok(cm), deadline, "kube-controller-manager")
        self._wait(lambda: self._get_ok(sched), deadline, "kube-scheduler")
        self._create_nodes(bins)
        if with_node:
            state.update(self._start_nodes(bins, api, nodes, deadline))
            sockets = [str(self.node_paths(node).containerd_socket) for node in nodes]
            state["real_node"] = {
                "name": nodes[0].name,
                "containerd_address": sockets[0],
                "ip": nodes[0].ip,
                "names": [node.name for node in nodes],
                "containerd_addresses": sockets,
            }
        self._wait(lambda: self._nodes_ready(bins), deadline, "kwok nodes Ready and untainted")
        self._wait(
            lambda: self._kubectl_ok(bins, "-n", "default", "get", "serviceaccount", "default"),
            deadline,
            "default service account",
        )
        state["startup_seconds"] = round(time.monotonic() - t0, 2)
        self.state_file.write_text(json.dumps(state, indent=2))

    # ------------------------------------------------------------ real node
    def _start_containerd(self, node: rn.NodeSpec) -> None:
        """A node's containerd first (it needs no apiserver): write the node's configs and
        start it in the node's namespace while the control plane comes up."""
        paths = self.node_paths(node)
        for d in paths.all_dirs():
            d.mkdir(parents=True, exist_ok=True)
        paths.containerd_config.write_text(rn.containerd_config(paths))
        rn.write_json(paths.cni_conf_dir / "10-mlbench.conflist", rn.cni_conflist(paths))
        paths.resolv_conf.write_text("# mlbench test node: cluster DNS only, no upstream resolvers\n")
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        # image pulls go to a proxy that is not there: only imported images exist
        env.update(HTTP_PROXY=rn.NO_EGRESS_PROXY, HTTPS_PROXY=rn.NO_EGRESS_PROXY, NO_PROXY="")
        self._spawn(node.component("containerd"), rn.containerd_args(paths), env=env)

    def _start_nodes(self, bins: Path, api: str, nodes: Sequence[rn.NodeSpec], deadline: float) -> dict[str, Any]:
        """Images, RBAC, storage, CoreDNS and the pv-reclaimer for all, then each node's
        kube-proxy and kubelet; wait for every node Ready and DNS serving.  Returns ports
        and timings for state.json."""
        router = netpol_binary()  # built before the clock: a cold build takes minutes
        t0 = time.monotonic()
        node_deadline = min(deadline, t0 + 90 + 30 * len(nodes))
        images: dict[str, dict[str, float]] = {}
        for node in nodes:
            sock = self.node_paths(node).containerd_socket
            self._wait(
                lambda sock=sock: sock.exists() and rn.ctr(sock, "version", check=False, timeout=5).returncode == 0,
                node_deadline,
                f"containerd on {sock}",
            )
            images[node.name] = rn.ensure_node_images(sock, self.node_paths(node).images_cache)
        kc = self.root / "kubeconfigs"
        self._kubectl_apply(bins, rn.node_rbac())
        rn.prepare_pv_dirs(self.pv_dir, nodes)
        self._kubectl_apply(bins, rn.storage_objects(self.pv_dir, nodes))
        ports: dict[str, Any] = {"coredns_ready_port": free_port()}
        corefile = self.root / "Corefile"
        corefile.write_text(rn.corefile(kc / "coredns.kubeconfig", ports["coredns_ready_port"]))
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        self._spawn("coredns", rn.coredns_args(bins, corefile), env=env)
        self._spawn(
            "pv-reclaimer",
            [
                sys.executable,
                "-m",
                "tests.cluster.pvreclaim",
                f"--kubectl={bins / 'kubectl'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--pv-dir={self.pv_dir}",
            ],
            env={**env, "PYTHONPATH": str(HERE.parents[1])},
        )
        t_kubelet = time.monotonic()
        ports["nodes"] = {node.name: self._start_node_agents(bins, api, node, env) for node in nodes}
        for node in nodes:
            self._wait(
                lambda node=node: self._real_node_ready(bins, node), node_deadline, f"real node {node.name} Ready"
            )
        node_ready = time.monotonic() - t_kubelet
        for node in nodes:  # kube-router finds its Node by name: once the kubelet registered it
            health = ports["nodes"][node.name]["kube_router_health_port"]
            router_args = rn.kube_router_args(router, node, kc / "kube-router.kubeconfig", health)
            self._spawn(node.component("kube-router"), router_args, env=env)
        ready_url = f"http://127.0.0.1:{ports['coredns_ready_port']}/ready"
        self._wait(lambda: self._get_ok(ready_url, tls=False), node_deadline, "CoreDNS ready")
        for node in nodes:
            kp = f"http://{node.ip}:{ports['nodes'][node.name]['kube_proxy_healthz_port']}/healthz"
            self._wait(lambda kp=kp: self._get_ok(kp, tls=False), node_deadline, f"kube-proxy of {node.name} healthy")
            kr = f"http://{node.ip}:{ports['nodes'][node.name]['kube_router_health_port']}/healthz"
            self._wait(lambda kr=kr: self._get_ok(kr, tls=False), node_deadline, f"kube-router of {node.name} healthy")
        return {
            **ports,
            "node_image_seconds": images,
            "node_ready_after_kubelet_seconds": round(node_ready, 2),
            "node_start_seconds": round(time.monotonic() - t0, 2),
        }

    def _start_node_agents(self, bins: Path, api: str, node: rn.NodeSpec, env: dict[str, str]) -> dict[str, Any]:
        """One node's kube-proxy and kubelet, in its namespace (ports on the node's address); returns the
        address and the ports (kube-router's too, started once the Node exists), for state.json."""
        paths = self.node_paths(node)
        self._ensure_node_pki(node)
        kc = self.root / "kubeconfigs"
        kubelet_kc = kc / f"kubelet-{node.name}.kubeconfig"
        kubelet_kc.write_text(yaml.safe_dump(self._kubeconfig_doc(api, node.name, f"kubelet-{node.name}")))
        kubelet_kc.chmod(0o600)
        ports = {
            "kubelet_port": free_port(),
            "kubelet_healthz_port": free_port(),
            "kube_proxy_healthz_port": free_port(),
            "kube_proxy_metrics_port": free_port(),
            "kube_router_health_port": free_port(),
        }
        proxy = rn.kube_proxy_config(
            node, kc / "kube-proxy.kubeconfig", ports["kube_proxy_healthz_port"], ports["kube_proxy_metrics_port"]
        )
        paths.kube_proxy_config.write_text(yaml.safe_dump(proxy))
        paths.kubelet_config.write_text(
            yaml.safe_dump(rn.kubelet_config(paths, self.pki, ports["kubelet_port"], ports["kubelet_healthz_port"]))
        )
        self._spawn(node.component("kube-proxy"), rn.kube_proxy_args(bins, paths), env=env)
        rn.ensure_cgroup_root(node.cgroup_root)
        self._spawn(node.component("kubelet"), rn.kubelet_args(bins, paths, kubelet_kc), env=env)
        return {"ip": node.ip, **ports}

    def _real_node_ready(self, bins: Path, node: rn.NodeSpec) -> bool:
        res = subprocess.run(
            [str(bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", "get", "node", node.name, "-o", "json"],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            return False
        doc = json.loads(res.stdout)
        return rn.ready_condition(doc) and rn.has_real_node_taint(doc)

    def _kubectl_apply(self, bins: Path, docs: list[dict[str, Any]]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        res = subprocess.run(
            [str(bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", "apply", "-f", "-"],
            input=body,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if res.returncode != 0:
            kinds = sorted({f"{d['kind']}/{d['metadata']['name']}" for d in docs})
            raise RuntimeError(f"kubectl apply of {kinds} failed: {res.stderr.strip()}")

    def _wait(self, check: Any, deadline: float, what: str) -> None:
        while True:
            if check():
                return
            for component, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{component} exited ({proc.returncode}) while waiting for {what}; "
                        f"see {self.logs / (component + '.log')}:\n{self._tail(component)}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}; logs in {self.logs}")
            time.sleep(0.2)

    def _tail(self, component: str, lines: int = 30) -> str:
        try:
            text = (self.logs / f"{component}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        # controller-manager/scheduler serve self-signed certs on loopback
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _get_ok(self, url: str, tls: bool = True) -> bool:
        try:
            ctx = self._ssl_context() if tls else None
            # never through a proxy from the environment: everything is local
            opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
            )
            with opener.open(url, timeout=2) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _kubectl_ok(self, bins: Path, *args: str) -> bool:
        res = subprocess.run(
            [str(bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        return res.returncode == 0

    def _create_nodes(self, bins: Path) -> None:
        docs = {"apiVersion": "v1", "kind": "List", "items": [n.manifest() for n in self.nodes]}
        subprocess.run(
            [str(bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", "create", "-f", "-"],
            input=json.dumps(docs),
            text=True,
            check=True,
            capture_output=True,
        )

    def _nodes_ready(self, bins: Path) -> bool:
        """Every fake node Ready and untainted (the real node is checked apart: it
        carries its taint on purpose)."""
        res = subprocess.run(
            [str(bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", "get", "nodes", "-o", "json"],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            return False
        fake = {n.name for n in self.nodes}
        items = [n for n in json.loads(res.stdout)["items"] if n["metadata"]["name"] in fake]
        if len(items) < len(fake):
            return False
        for node in items:
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            if conds.get("Ready") != "True" or node.get("spec", {}).get("taints"):
                return False
        return True

    # ------------------------------------------------------------------ PKI
    def _ensure_pki(self) -> None:
        """CA, serving certs, client certs and SA key; generated once per
        cluster dir (and again when PKI_VERSION changes), EC P-256 keys: fast."""
        pki = self.pki
        marker = pki / ".complete"
        if marker.exists() and marker.read_text().strip() == PKI_VERSION:
            return
        subprocess.run(["rm", "-rf", str(pki)], check=True)
        pki.mkdir(parents=True, mode=0o700)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl(
            "req",
            "-x509",
            *ec,
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "3650",
            "-subj",
            "/CN=mlbench-local-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            cwd=pki,
        )
        sans = ",".join(
            [
                f"IP:{HOST}",
                f"IP:{rn.BRIDGE_IP}",
                f"IP:{SERVICE_IP}",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ]
        )
        certs = {
            # name: (subject, extendedKeyUsage, subjectAltName)
            "apiserver": ("/CN=kube-apiserver", "serverAuth", sans),
            "admin": ("/O=system:masters/CN=mlbench-admin", "clientAuth", None),
            "controller-manager": ("/CN=system:kube-controller-manager", "clientAuth", None),
            "scheduler": ("/CN=system:kube-scheduler", "clientAuth", None),
            # kwok plays every kubelet (node status, leases, pod status and
            # deletion): simplest truthful identity is a cluster admin.
            "kwok": ("/O=system:masters/CN=kwok-controller", "clientAuth", None),
            # the real nodes (their kubelets' certs: _ensure_node_pki): kube-proxy (default binding
            # system:node-proxier), CoreDNS (mlbench:coredns role) and the apiserver's kubelet client
            "kube-proxy": ("/CN=system:kube-proxy", "clientAuth", None),
            "coredns": ("/CN=mlbench:coredns", "clientAuth", None),
            "kube-router": ("/CN=mlbench:kube-router", "clientAuth", None),
            "apiserver-kubelet-client": ("/CN=kube-apiserver-kubelet-client", "clientAuth", None),
        }
        for name, (subj, eku, san) in certs.items():
            self._issue(name, subj, eku, san)
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=pki)
        _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
        marker.write_text(f"{PKI_VERSION}\n")

    def _ensure_node_pki(self, node: rn.NodeSpec) -> None:
        """A real node's kubelet certificates (once per cluster dir): its client identity for the
        Node authorizer and its serving certificate on the node's address."""
        if (self.pki / f"kubelet-serving-{node.name}.crt").exists():
            return
        self._issue(f"kubelet-{node.name}", f"/O=system:nodes/CN=system:node:{node.name}", "clientAuth", None)
        self._issue(f"kubelet-serving-{node.name}", f"/CN={node.name}", "serverAuth", f"IP:{node.ip},DNS:{node.name}")

    def _issue(self, name: str, subj: str, eku: str, san: str | None) -> None:
        """A key and a certificate signed by the cluster CA."""
        pki = self.pki
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=pki)
        ext = [f"extendedKeyUsage={eku}", "keyUsage=critical,digitalSignature,keyEncipherment"]
        if san:
            ext.append(f"subjectAltName={san}")
        (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
        _openssl(
            *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"),
            *("-out", f"{name}.crt", "-days", "3650", "-sha256", "-extfile", f"{name}.ext"),
            cwd=pki,
        )

    def _kubeconfig_doc(self, server: str, user: str, cert: str) -> dict[str, Any]:
        pki = self.pki
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "mlbench-local",
                    "cluster": {"server": server, "certificate-authority-data": _b64(pki / "ca.crt")},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": _b64(pki / f"{cert}.crt"),
                        "client-key-data": _b64(pki / f"{cert}.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "mlbench-local", "context": {"cluster": "mlbench-local", "user": user, "namespace": "default"}}
            ],
            "current-context": "mlbench-local",
            "preferences": {},
        }

    def _write_kubeconfigs(self, server: str) -> None:
        kc = self.root / "kubeconfigs"
        kc.mkdir(parents=True, exist_ok=True)
        for cert in ("controller-manager", "scheduler", "kwok", "kube-proxy", "coredns", "kube-router"):
            path = kc / f"{cert}.kubeconfig"
            path.write_text(yaml.safe_dump(self._kubeconfig_doc(server, cert, cert)))
            path.chmod(0o600)
        tmp = self.kubeconfig.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(self._kubeconfig_doc(server, "mlbench-admin", "admin")))
        tmp.chmod(0o600)
        tmp.replace(self.kubeconfig)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``python -m tests.cluster up|down|env|status|build|import-image [--dir DIR]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "down", "env", "status", "build", "import-image"])
    parser.add_argument("archive", nargs="*", type=Path, help="import-image: docker-archive or OCI tar(s)")
    parser.add_argument("--dir", type=Path, default=default_cluster_dir(), help="cluster state dir")
    args = parser.parse_args(argv)
    cluster = LocalCluster(root=args.dir)
    if args.command == "build":
        print(ensure_binaries())
    elif args.command == "up":
        t0 = time.monotonic()
        started = cluster.up()
        verb = "started" if started else "already running"
        node = cluster.real_node()
        where = (
            f"real nodes {', '.join(node.names)} + kwok nodes"
            if node
            else f"kwok nodes only ({cluster.real_node_reason()})"
        )
        print(f"cluster {verb} in {time.monotonic() - t0:.1f}s, {where}; kubeconfig:", file=sys.stderr)
        print(cluster.kubeconfig)
    elif args.command == "down":
        cluster.down()
        print("cluster down", file=sys.stderr)
    elif args.command == "env":
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        print(f"export MLBENCH_TEST_KUBECONFIG={cluster.kubeconfig}")
        print(f"export MLBENCH_KUBECTL={kubectl_path()}")
        print(f"export PATH={bin_dir()}:$PATH")
        node = cluster.real_node()
        if node is not None and node.containerd_address:
            print(f"export MLBENCH_CONTAINERD_ADDRESS={node.containerd_address}")
            print(f"export MLBENCH_CONTAINERD_ADDRESSES='{' '.join(node.containerd_addresses)}'")
        else:
            print(f"# no real node: {cluster.real_node_reason()}")
    elif args.command == "status":
        st = cluster.status()
        for name, alive in st.items():
            print(f"{name:26s} {'running' if alive else 'stopped'}")
        return 0 if all(st.values()) else 1
    elif args.command == "import-image":
        if not args.archive:
            parser.error("import-image needs at least one ARCHIVE")
        for archive in args.archive:
            t0 = time.monotonic()
            names = cluster.import_image(archive)
            took = time.monotonic() - t0
            print(f"imported {archive} ({', '.join(names) or 'no names'}) in {took:.1f}s", file=sys.stderr)
    return 0
