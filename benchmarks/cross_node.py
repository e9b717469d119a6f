"""Runs that cross nodes, on the test cluster's real nodes: time per epoch, communication share and bytes per
step of 1, 2 and 4 workers (one per node where there are nodes enough), gloo and mpi, with and without a
bandwidth cap on every worker's egress, for task 2a's synthetic stand-in and the 1a smoke recipe.

    make cluster-up                                 # the real nodes (root)
    sudo .venv/bin/python benchmarks/cross_node.py  # builds and loads the images, installs the operator as e2e does
    sudo .venv/bin/python benchmarks/cross_node.py --tasks 2a --workers 1,2 --backends gloo   # a part of it

What it measures and what it does not: every real node of the test cluster is a network namespace of ONE VM
and they share its 2 cores (tests/cluster/README.md), so a speedup here measures the plumbing (routes, ssh,
gloo and Open MPI over real sockets between nodes, the htb cap), never hardware. Four workers on two nodes run two
per node. The 1a rows train on 1024 images of the JPEG copy of CIFAR-10 (``../shared/datasets/cifar10-jpeg.tar.gz``,
served in the cluster), 2a's on generated data with epsilon's shape: neither is a result.

Writes the raw rows to ``benchmarks/results/<date>-cross-node.json`` (``--out``) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mlbench_api import download, hardware  # noqa: E402
from mlbench_operator.run.results import recorded  # noqa: E402
from tests.cluster.cluster import LocalCluster, kubectl_path  # noqa: E402
from tests.cluster.plugin import KubeCluster, create_namespace  # noqa: E402
from tests.e2e.conftest import E2E, _build_images, _install_operator, serving_data  # noqa: E402

#: task 2a's open stand-in (generated data, in the shipped catalog) and the e2e's shortened 1a smoke recipe
TASKS = {"2a": "epsilon-logreg-synthetic", "1a": "smoke"}
LAUNCHER_CPU_MILLI = 100
#: what the operator's pods and the dataset server ask of each node, besides the run's pods
OTHER_CPU_MILLI = 150


def worker_cpu(workers: int, nodes: int, node_cpu_milli: int = 2000) -> str:
    """CPU per worker such that the workers per node and the launcher fit one node's allocatable CPUs."""
    per_node = -(-workers // nodes)
    return f"{(node_cpu_milli - LAUNCHER_CPU_MILLI - OTHER_CPU_MILLI) // per_node}m"


def placement(workers: int, nodes: int) -> str:
    """One worker per node where the nodes suffice (the seeds' environment), else spread evenly."""
    return "OneWorkerPerNode" if workers <= nodes else "Spread"


def row(task: str, workers: int, backend: str, cap: int | None, st: dict[str, Any]) -> dict[str, Any]:
    """One run's figures from its status (``result`` and the nodes its ranks ran on)."""
    result = st.get("result") or {}
    comm, compute = result.get("communicationSeconds"), result.get("computeSeconds")
    epochs = result.get("epochs") or 0
    wall = result.get("wallClockSeconds")
    return {
        "task": task,
        "workers": workers,
        "backend": backend,
        "capMbit": cap,
        "phase": st.get("phase"),
        "epochs": epochs,
        "secondsPerEpoch": wall / epochs if wall and epochs else None,
        "communicationShare": comm / (comm + compute) if comm is not None and compute else None,
        "bytesPerStep": result.get("bytesPerStep"),
        "samplesPerSecond": result.get("samplesPerSecond"),
        "finalAccuracy": result.get("finalAccuracy"),
        "result": result,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'task':4} {'workers':>7} {'backend':7} {'cap':>6} {'s/epoch':>8} {'comm share':>10} {'bytes/step':>11}"
    lines = [head]
    for r in rows:
        cap = f"{r['capMbit']}M" if r["capMbit"] else "-"
        spe = f"{r['secondsPerEpoch']:.2f}" if r["secondsPerEpoch"] else r["phase"]
        share = f"{r['communicationShare']:.3f}" if r["communicationShare"] is not None else "-"
        size = r["bytesPerStep"] or "-"
        lines.append(f"{r['task']:4} {r['workers']:>7} {r['backend']:7} {cap:>6} {spe:>8} {share:>10} {size:>11}")
    return "\n".join(lines)


def environment(cluster: LocalCluster) -> tuple[E2E, KubeCluster]:
    """Images built and loaded, the operator installed, a privileged namespace (the netem init container) with the
    dataset server: what the e2e fixture does."""
    node = cluster.real_node()
    if node is None:
        raise SystemExit(f"no real nodes: {cluster.real_node_reason()} (make cluster-up as root)")
    kube = KubeCluster(cluster.kubeconfig, str(kubectl_path()), False, (), cluster)
    _build_images(node.containerd_addresses)
    _install_operator(kube, node, Path(tempfile.mkdtemp(prefix="mlbench-study-helm-")))
    namespace = create_namespace(kube, f"mlbench-study-{dt.datetime.now(dt.UTC):%H%M%S}", pod_security="privileged")
    env = serving_data(kube, node, namespace)
    return env, kube


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="2a,1a")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--backends", default="gloo,mpi")
    p.add_argument("--cap-mbit", type=int, default=20, help="the bandwidth cap of the capped rows (0: no capped rows)")
    p.add_argument("--out", type=Path, default=REPO / f"benchmarks/results/{dt.date.today()}-cross-node.json")
    args = p.parse_args(argv)
    env, kube = environment(LocalCluster())
    tasks = {t: (env.task("study-cifar10") if TASKS[t] == "smoke" else TASKS[t]) for t in args.tasks.split(",")}
    nodes = len(env.real_nodes)
    caps: list[int | None] = [None] + ([args.cap_mbit] if args.cap_mbit else [])
    rows = []
    try:
        for label, task in tasks.items():
            for workers in (int(w) for w in args.workers.split(",")):
                for backend in args.backends.split(","):
                    for cap in caps:
                        name = f"x-{label}-{workers}-{backend}-{cap or 'free'}"
                        spec: dict[str, Any] = {
                            "workers": workers,
                            "backend": backend,
                            "resources": {"cpu": worker_cpu(workers, nodes), "memory": "2Gi"},
                            "scheduling": {**env.scheduling, "placement": placement(workers, nodes)},
                            **({"network": {"bandwidthMbit": cap}} if cap else {}),
                        }
                        load_before = os.getloadavg()[0]
                        env.run(name, task, **spec)
                        st = env.wait_finished(name, timeout=1800)
                        extra = {"nodes": kept_nodes(env, name), "loadAverage1m": [load_before, os.getloadavg()[0]]}
                        rows.append({**row(label, workers, backend, cap, st), **extra})
                        print(table(rows[-1:]).splitlines()[-1], flush=True)
                        kube.kubectl("delete", "benchmarkrun", name, "-n", env.namespace, "--wait=false")
    finally:
        kube.kubectl("delete", "namespace", env.namespace, "--wait=false")
        for task in env.tasks:
            kube.kubectl("delete", "benchmarktask", task, "--wait=false")
    report = {
        "command": "sudo .venv/bin/python benchmarks/cross_node.py " + " ".join(argv or sys.argv[1:]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"the test cluster's {nodes} real nodes: network namespaces of one 2-core VM (shared cores)",
        "cores": os.cpu_count(),
        "note": "loadAverage1m: the VM's 1-minute load before and after each run (other work shares the cores)",
        "data": "1a: 1024 images of the JPEG copy of CIFAR-10; 2a: generated data with epsilon's shape",
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(rows))
    print(f"raw rows: {args.out}")
    return 0


def kept_nodes(env: E2E, run: str) -> list[str] | None:
    """The node each rank ran on, from the run's kept ``summary.json`` (its results ConfigMap)."""
    st = env.wait_status(run, recorded, 150, "status.results recorded")
    name = (st.get("results") or {}).get("configMap")
    if not name:
        return None
    summary = download.from_config_map(env.get("configmap", name).get("binaryData")).summary
    return hardware.hardware_nodes(summary) if summary is not None else None


if __name__ == "__main__":
    sys.exit(main())
