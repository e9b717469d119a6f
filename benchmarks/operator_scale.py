"""Operator scale benchmark: time from ``kubectl apply`` to a world of N Running workers, and API cost.

For each N (default 64, 256, 1000) it applies one BenchmarkRun with N workers on the local kwok
control plane (tests/cluster) and reports

* ``pods_running_s``: apply -> every worker pod ``Running`` (as an independent observer sees it),
* ``status_ready_s``: apply -> ``status.workers.ready == N`` (what ``kubectl get br`` shows),
* ``launcher_running_s``: apply -> ``status.phase == Running`` (launcher created after all Ready),
* ``operator_requests``: API requests the operator's reconciler made for this run, by verb/resource
  (from its own ``mlbench_operator_api_requests_total``; kopf's watch streams are not counted),
* ``gang_restart_s`` / ``restart_requests``: worker 0 then fails (kwok exit code 1); time until the
  whole world was deleted, recreated and is Running again, and the requests that took,
* ``floor_s`` / ``ratio``: right before each run, the same number of bare pods of the workers' shape
  created straight to the API server by a plain 32-thread client (the cluster's floor), and
  ``pods_running_s / floor_s`` (issue 10's target: at most 1.2),

then ``--many`` runs x workers (default 20 x 50) applied together: all Running, and the operator's
API requests per run.

Usage::

    python benchmarks/operator_scale.py                      # starts the local cluster if needed
    python benchmarks/operator_scale.py --workers 64 256 --json out.json
    MLBENCH_TEST_KUBECONFIG=~/.kube/config python benchmarks/operator_scale.py

Not a test: it prints figures and asserts nothing beyond each run reaching Running.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for sub in ("crds", "operator", "runners", ""):
    sys.path.insert(0, str(REPO / sub))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from mlbench_operator import builders, reconcile  # noqa: E402
from mlbench_operator.kube import Kube, load_configuration  # noqa: E402
from tests.cluster.cluster import free_port  # noqa: E402
from tests.operator import helpers as h  # noqa: E402


def operator_requests(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "mlbench_operator_api_requests_total":
                key = f"{s.labels['verb']} {s.labels['resource']}"
                out[key] = out.get(key, 0.0) + s.value
    return out


class Bench:
    def __init__(self, kubeconfig: Path, kubectl: str) -> None:
        self.kubeconfig = kubeconfig
        self.kubectl_bin = kubectl
        self.kube = Kube(load_configuration(str(kubeconfig)))

    def kubectl(self, *args: str, input: str | None = None) -> str:
        res = subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=True,
        )
        return res.stdout

    def running_workers(self, ns: str, run: str) -> int:
        pods = self.kube.request(
            "GET",
            f"/api/v1/namespaces/{ns}/pods",
            query=[("labelSelector", f"mlbench.io/run={run},mlbench.io/role=worker")],
            resource="bench",
        )
        return sum(1 for p in pods["items"] if (p.get("status") or {}).get("phase") == "Running")

    def run_status(self, ns: str, run: str) -> dict[str, Any]:
        obj = self.kube.request("GET", f"/apis/mlbench.io/v1alpha1/namespaces/{ns}/benchmarkruns/{run}")
        return dict(obj.get("status") or {})

    def floor(self, workers: int, timeout: float, threads: int = 32) -> float:
        """The cluster's own floor: ``workers`` bare pods of the same shape as a run's workers, created
        straight to the API server by a plain ``threads``-thread client; seconds until all are Running."""
        from concurrent.futures import ThreadPoolExecutor

        ns = f"floor-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", ns)
        body = h.run("floor", ns, workers=workers, resources={"cpu": "10m", "memory": "16Mi"})
        admitted = reconcile.admit(body, h.task())
        assert not isinstance(admitted, reconcile.Rejection), admitted
        ctx = admitted[0]
        pods = []
        for rank in range(workers):
            pod = builders.worker_pod(ctx, rank, 0)
            pod["metadata"].pop("ownerReferences", None)  # no run behind them
            # not the operator's labels: its pod watch must not see (or slow) the floor
            pod["metadata"]["labels"] = {"mlbench.io/run": "floor", "mlbench.io/role": "worker"}
            pods.append(pod)
        t0 = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(self.kube.create, pods))
        while self.running_workers(ns, "floor") < workers:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"floor: {workers} bare pods not Running after {timeout}s")
            time.sleep(0.2)
        took = time.monotonic() - t0
        self.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s")
        return took

    def many(self, runs: int, workers: int, port: int, timeout: float) -> dict[str, Any]:
        """``runs`` runs of ``workers`` applied together: seconds until every worker of all is Running, and the
        operator's API requests per run (which must stay O(workers))."""
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", ns)
        before = operator_requests(port)
        bodies = []
        for i in range(runs):
            body = h.run(f"many{i}", ns, workers=workers, resources={"cpu": "10m", "memory": "16Mi"})
            body["metadata"]["labels"] = {"mlbench.io/benchmark": "operator-scale"}
            bodies.append(body)
        t0 = time.monotonic()
        self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(b) for b in bodies))
        while True:
            pods = self.kube.request(
                "GET",
                f"/api/v1/namespaces/{ns}/pods",
                query=[("labelSelector", "mlbench.io/role=worker")],
                resource="bench",
            )
            running = sum(1 for p in pods["items"] if (p.get("status") or {}).get("phase") == "Running")
            if running == runs * workers:
                break
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{runs}x{workers}: {running} Running after {timeout}s")
            time.sleep(0.3)
        took = time.monotonic() - t0
        time.sleep(2.0)
        after = operator_requests(port)
        total = int(sum(after.values()) - sum(before.values()))
        self.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s")
        return {"runs": runs, "workers": workers, "all_running_s": round(took, 2), "requests_per_run": total / runs}

    def one(self, workers: int, port: int, timeout: float, restart: bool) -> dict[str, Any]:
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        run = f"scale{workers}"
        self.kubectl("create", "namespace", ns)
        body = h.run(run, ns, workers=workers, resources={"cpu": "10m", "memory": "16Mi"})
        body["metadata"]["labels"] = {"mlbench.io/benchmark": "operator-scale"}
        before = operator_requests(port)
        t0 = time.monotonic()
        self.kubectl("apply", "-f", "-", input=json.dumps(body))
        marks: dict[str, float] = {}
        while len(marks) < 3:
            now = time.monotonic() - t0
            if now > timeout:
                raise TimeoutError(f"{workers} workers: not Running after {timeout}s ({marks})")
            if "pods_running_s" not in marks and self.running_workers(ns, run) == workers:
                marks["pods_running_s"] = time.monotonic() - t0
            st = self.run_status(ns, run)
            if "status_ready_s" not in marks and (st.get("workers") or {}).get("ready") == workers:
                marks["status_ready_s"] = time.monotonic() - t0
            if "launcher_running_s" not in marks and st.get("phase") == "Running":
                marks["launcher_running_s"] = time.monotonic() - t0
            time.sleep(0.2)
        time.sleep(1.0)  # let trailing status writes land before counting
        after = operator_requests(port)
        reqs = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
        out: dict[str, Any] = {
            "workers": workers,
            **{k: round(v, 2) for k, v in marks.items()},
            "operator_requests": int(sum(reqs.values())),
            "by_kind": {k: int(v) for k, v in sorted(reqs.items())},
        }
        if restart:
            # One rank fails: the whole world is torn down and recreated (gang restart).
            t1 = time.monotonic()
            self.kubectl("-n", ns, "annotate", "pod", f"{run}-worker-0", "mlbench.io/kwok-exit-code=1")
            while True:
                if time.monotonic() - t1 > timeout:
                    raise TimeoutError(f"{workers} workers: gang restart not done after {timeout}s")
                st = self.run_status(ns, run)
                if st.get("restarts") == 1 and st.get("phase") == "Running":
                    break
                time.sleep(0.2)
            out["gang_restart_s"] = round(time.monotonic() - t1, 2)
            time.sleep(1.0)
            again = operator_requests(port)
            out["restart_requests"] = int(sum(again.values()) - sum(after.values()))
        self.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s")
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 256, 1000])
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--no-restart", action="store_true", help="skip the gang-restart measurement")
    parser.add_argument("--many", type=int, nargs=2, default=[20, 50], metavar=("RUNS", "WORKERS"))
    args = parser.parse_args(argv)

    from tests.cluster.cluster import LocalCluster, kubectl_path
    from tests.cluster.plugin import KubeCluster, install_crds

    local: LocalCluster | None = None
    external = os.environ.get("MLBENCH_TEST_KUBECONFIG")
    if external:
        kubeconfig = Path(external)
        kubectl = os.environ.get("MLBENCH_KUBECTL", "kubectl")
        started = False
    else:
        local = LocalCluster()
        started = local.up(timeout=300)
        kubeconfig = local.kubeconfig
        kubectl = os.environ.get("MLBENCH_KUBECTL", str(kubectl_path()))
    proc: subprocess.Popen[bytes] | None = None
    try:
        install_crds(KubeCluster(kubeconfig, kubectl, started, ()))
        bench = Bench(kubeconfig, kubectl)
        bench.kubectl("apply", "-f", "-", input=json.dumps(h.task()))
        port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PYTHONPATH": os.pathsep.join(str(REPO / s) for s in ("crds", "operator", "runners", "")),
        }
        log = Path(tempfile.gettempdir()) / "mlbench-operator-scale.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mlbench_operator.main",
                    f"--metrics-port={port}",
                    "--liveness=",
                    "--selector=mlbench.io/benchmark=operator-scale",  # leave other runs on the cluster alone
                    "--no-leader-elect",  # the only replica
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                operator_requests(port)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"operator did not start; see {log}") from None
                time.sleep(0.3)
        results = []
        for n in args.workers:
            floor = bench.floor(n, args.timeout)  # side by side: the floor right before the run
            res = bench.one(n, port, args.timeout, not args.no_restart)
            res["floor_s"] = round(floor, 2)
            res["ratio"] = round(res["pods_running_s"] / floor, 2)
            results.append(res)
            print(json.dumps(res), flush=True)
        many = bench.many(args.many[0], args.many[1], port, args.timeout)
        print(json.dumps(many), flush=True)
        print(
            f"\n{'workers':>8} {'floor':>7} {'pods Running':>13} {'ratio':>6} {'status ready':>13} {'launcher':>9}"
            f" {'op requests':>12} {'gang restart':>13} {'restart reqs':>13}"
        )
        for r in results:
            print(
                f"{r['workers']:>8} {r['floor_s']:>6.1f}s {r['pods_running_s']:>12.1f}s {r['ratio']:>6.2f}"
                f" {r['status_ready_s']:>12.1f}s {r['launcher_running_s']:>8.1f}s {r['operator_requests']:>12}"
                f" {r.get('gang_restart_s', float('nan')):>12.1f}s {r.get('restart_requests', 0):>13}"
            )
        print(
            f"\n{many['runs']} runs x {many['workers']} workers applied together: all Running in "
            f"{many['all_running_s']:.1f}s, {many['requests_per_run']:.0f} operator API requests per run"
        )
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        if local is not None and started:
            local.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
