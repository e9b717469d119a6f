"""Tenant load test (issue 33): many runs at once beside noisy tenants, the operator killed and the API server
restarted on the way; every run must still reach its final phase, and the operator must not crash-loop.

On the local kwok control plane (tests/cluster; ``MLBENCH_TEST_KUBECONFIG`` for another one of its clusters):

1. noise: ``--noise`` pods (default 3000) in ``--noise-namespaces`` other namespaces, of the workers' shape and
   with the operator's labels (a tenant can set them), each with a ``--annotation-kb`` annotation, created by a
   plain 32-thread client (kwok turns them Running);
2. the operator of this checkout, its data segment capped (``prlimit --data``) at the memory limit of the shipped
   Deployment (manifests/operator/deployment.yaml); its RSS sampled every 0.5 s (``/proc``: VmRSS, VmHWM);
3. ``--runs`` x ``--workers`` (default 50 x 20) BenchmarkRuns applied at once, spread over ``--tenants``
   namespaces; each launcher the operator creates is finished by the bench (kwok's exit-code annotation with a
   valid RunSummary as its termination message, as the operator's cluster tests do);
4. chaos, on progress: the operator SIGKILLed (and started again) once a quarter of the workers are Ready, the
   kube-apiserver restarted (tests/cluster's ``restart_component``) once a quarter of the runs have finished,
   the operator SIGKILLed again once half of them have;

and reports: each run's final phase, the seconds until all were final, the operator's exits that the bench did
not cause (a crash loop: any), its peak memory against the limit, and the API requests by verb, resource and
status code, e.g. ``"POST pods 409"`` (the operator's own counter summed over its lives, and the API server's for
every client, summed over its two), with the pod creates by code beside them (``pod_creates``).

Usage::

    python benchmarks/tenant_load.py --json benchmarks/results/2026-11-29-tenant-load.json

Not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.operator_scale import (  # noqa: E402 - it puts the checkout's packages on sys.path
    Bench,
    apiserver_metrics,
    apiserver_requests,
    bare_worker_pods,
    operator_requests,
    start_operator,
)
from mlbench_operator.kube import ApiError  # noqa: E402
from tests import factories  # noqa: E402
from tests.cluster.cluster import LocalCluster, free_port, kubectl_path  # noqa: E402
from tests.cluster.plugin import KubeCluster, install_crds  # noqa: E402
from tests.operator import helpers as h  # noqa: E402

SELECTOR = "mlbench.io/benchmark=tenant-load"
FINAL = ("Succeeded", "Failed")
#: what a request meets while the API server restarts
UNAVAILABLE = (ApiError, OSError, urllib3.exceptions.HTTPError)
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9, "": 1}


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``1Gi``, ``512Mi``, ``1000M``) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|K|M|G|)", quantity.strip())
    if match is None:
        raise ValueError(f"resources.limits.memory: cannot read {quantity!r}")
    return int(match[1]) * UNITS[match[2]]


def shipped_memory_limit(manifest: Path = REPO / "manifests/operator/deployment.yaml") -> str:
    """The operator container's ``resources.limits.memory`` in the shipped Deployment."""
    for doc in yaml.safe_load_all(manifest.read_text()):
        if (doc or {}).get("kind") == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                limit = (container.get("resources") or {}).get("limits", {}).get("memory")
                if limit:
                    return str(limit)
    raise ValueError(f"{manifest}: no Deployment container with resources.limits.memory")


def proc_status_kb(pid: int, field: str) -> int:
    """One ``/proc/<pid>/status`` field in kB (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def add_counts(total: dict[str, float], more: dict[str, float]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0.0) + value


def grown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


class Operator:
    """The operator process under test: started capped, sampled for memory, killed and started again; any exit
    the bench did not cause is counted (and the operator started again, as its Deployment would)."""

    def __init__(self, kubeconfig: Path, limit_bytes: int, log: Path) -> None:
        self.kubeconfig, self.log = kubeconfig, log
        self.wrapper = ("prlimit", f"--data={limit_bytes}", "--")
        self.port = free_port()
        self.requests: dict[str, float] = {}  # summed over the lives before this one
        self.peak_rss_kb = 0
        self.kills = 0
        self.unexpected_exits: list[int] = []
        self.starts_s: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.proc = self._start()
        self._sampler = threading.Thread(target=self._sample, name="operator-rss", daemon=True)
        self._sampler.start()

    def _start(self) -> subprocess.Popen[bytes]:
        t0 = time.monotonic()
        proc = start_operator(self.kubeconfig, self.port, SELECTOR, self.log, self.wrapper)
        self.starts_s.append(round(time.monotonic() - t0, 2))
        return proc

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                pid = self.proc.pid
                self.peak_rss_kb = max(self.peak_rss_kb, proc_status_kb(pid, "VmHWM"), proc_status_kb(pid, "VmRSS"))
                if self.proc.poll() is not None:  # not ours: we hold the lock while killing
                    self.unexpected_exits.append(self.proc.returncode)
                    self.proc = self._start()

    def scrape(self) -> dict[str, float]:
        try:
            return operator_requests(self.port)
        except OSError:
            return {}

    def kill(self) -> None:
        """SIGKILL (its requests counted up to right before), then start it again."""
        with self._lock:
            add_counts(self.requests, self.scrape())
            self.peak_rss_kb = max(self.peak_rss_kb, proc_status_kb(self.proc.pid, "VmHWM"))
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
            self.kills += 1
            self.proc = self._start()

    def stop(self) -> dict[str, float]:
        """Stop sampling and the operator; the requests of all its lives."""
        self._stop.set()
        self._sampler.join(5)
        with self._lock:
            add_counts(self.requests, self.scrape())
            self.peak_rss_kb = max(self.peak_rss_kb, proc_status_kb(self.proc.pid, "VmHWM"))
            self.proc.terminate()
            self.proc.wait(30)
        return self.requests


class TenantLoad:
    def __init__(self, bench: Bench, cluster: LocalCluster, args: argparse.Namespace) -> None:
        self.bench, self.kube, self.cluster, self.args = bench, bench.kube, cluster, args
        tag = uuid.uuid4().hex[:5]
        self.tenants = [f"tenant-{tag}-{i}" for i in range(args.tenants)]
        self.noise_namespaces = [f"noise-{tag}-{i}" for i in range(args.noise_namespaces)]
        self.finished: set[str] = set()  # launchers the bench has finished

    def noise(self) -> float:
        """The noisy tenants' pods; seconds their creation took."""
        annotation = {"example.com/blob": "x" * (self.args.annotation_kb * 1024)}
        pods = []
        for i, ns in enumerate(self.noise_namespaces):
            self.bench.kubectl("create", "namespace", ns)
            count = self.args.noise // len(self.noise_namespaces)
            for pod in bare_worker_pods(ns, count, labels=None, annotations=annotation):
                pod["metadata"]["labels"]["mlbench.io/run"] = f"noise{i}"  # the operator's labels, another run's name
                pod["metadata"]["name"] = pod["metadata"]["name"].replace("floor", f"noise{i}")
                pods.append(pod)
        t0 = time.monotonic()
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(self.kube.create, pods))
        return round(time.monotonic() - t0, 2)

    def apply_runs(self) -> None:
        bodies = []
        for i in range(self.args.runs):
            ns = self.tenants[i % len(self.tenants)]
            body = h.run(f"load{i}", ns, workers=self.args.workers, resources={"cpu": "10m", "memory": "16Mi"})
            body["metadata"] = {"name": f"load{i}", "namespace": ns, "labels": {"mlbench.io/benchmark": "tenant-load"}}
            bodies.append(body)
        for ns in self.tenants:
            self.bench.kubectl("create", "namespace", ns)
        self.bench.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(b) for b in bodies))

    def statuses(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for ns in self.tenants:
            try:
                listed = self.kube.request("GET", f"/apis/mlbench.io/v1alpha1/namespaces/{ns}/benchmarkruns")
            except UNAVAILABLE:
                continue  # the API server restarting
            for run in listed["items"]:
                out[f"{ns}/{run['metadata']['name']}"] = dict(run.get("status") or {})
        return out

    def finish_launchers(self) -> None:
        """Every launcher not finished yet: exit code 0 and a valid RunSummary (kwok completes it)."""
        for ns in self.tenants:
            try:
                pods = self.kube.request(
                    "GET", f"/api/v1/namespaces/{ns}/pods", query=[("labelSelector", "mlbench.io/role=launcher")]
                )["items"]
            except UNAVAILABLE:
                continue
            for pod in pods:
                name, key = pod["metadata"]["name"], f"{ns}/{pod['metadata']['uid']}"
                if key in self.finished:
                    continue
                run = pod["metadata"]["labels"]["mlbench.io/run"]
                message = factories.summary(run, world_size=self.args.workers).termination_message()
                patch = {
                    "metadata": {
                        "annotations": {
                            "mlbench.io/kwok-exit-code": "0",
                            "mlbench.io/kwok-termination-message": message,
                        }
                    }
                }
                try:
                    self.kube.request(
                        "PATCH",
                        f"/api/v1/namespaces/{ns}/pods/{name}",
                        patch,
                        content_type="application/merge-patch+json",
                    )
                    self.finished.add(key)
                except UNAVAILABLE:
                    continue

    def drive(self, op: Operator) -> dict[str, Any]:
        """Finish launchers and inject the chaos on progress until every run is final (or the timeout)."""
        total_workers = self.args.runs * self.args.workers
        events: list[dict[str, Any]] = []
        t0 = time.monotonic()
        api_counts: dict[str, float] = {}
        api0 = apiserver_requests(apiserver_metrics(self.kube))
        while True:
            now = round(time.monotonic() - t0, 2)
            self.finish_launchers()
            st = self.statuses()
            ready = sum((s.get("workers") or {}).get("ready", 0) for s in st.values())
            final = sum(1 for s in st.values() if s.get("phase") in FINAL)
            done = [e["what"] for e in events]
            if "operator SIGKILL 1" not in done and ready >= total_workers // 4:
                op.kill()
                events.append({"what": "operator SIGKILL 1", "at_s": now, "ready": ready, "final": final})
            elif "kube-apiserver restart" not in done and final >= self.args.runs // 4:
                add_counts(api_counts, grown(api0, apiserver_requests(apiserver_metrics(self.kube))))
                took = self.cluster.restart_component("kube-apiserver")
                api0 = {}
                events.append({"what": "kube-apiserver restart", "at_s": now, "took_s": round(took, 2), "final": final})
            elif "operator SIGKILL 2" not in done and final >= self.args.runs // 2:
                op.kill()
                events.append({"what": "operator SIGKILL 2", "at_s": now, "ready": ready, "final": final})
            if final == self.args.runs and len(st) == self.args.runs:
                break
            if time.monotonic() - t0 > self.args.timeout:
                break
            time.sleep(1.0)
        all_final_s = round(time.monotonic() - t0, 2)
        add_counts(api_counts, grown(api0, apiserver_requests(apiserver_metrics(self.kube))))
        phases: dict[str, int] = {}
        for s in st.values():
            phases[s.get("phase") or "none"] = phases.get(s.get("phase") or "none", 0) + 1
        return {
            "all_final": final == self.args.runs,
            "all_final_s": all_final_s,
            "phases": phases,
            "restarts_max": max((s.get("restarts") or 0 for s in st.values()), default=0),
            "chaos": events,
            "apiserver_requests": {k: int(v) for k, v in sorted(api_counts.items()) if v >= 5},
            "apiserver_pod_creates": by_code(api_counts, "POST pods"),
        }

    def cleanup(self) -> None:
        for ns in self.tenants + self.noise_namespaces:
            self.bench.kubectl("delete", "namespace", ns, "--wait=false")


def by_code(requests: dict[str, float], what: str) -> dict[str, int]:
    """The requests of ``what`` (a verb and resource: "POST pods") by status code, from the counts keyed
    "verb resource code"."""
    out: dict[str, int] = {}
    for key, value in requests.items():
        head, _, code = key.rpartition(" ")
        if head == what:
            out[code] = out.get(code, 0) + int(value)
    return dict(sorted(out.items()))


def by_verb(requests: dict[str, float]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in requests.items():
        verb = key.split(" ", 1)[0]
        out[verb] = out.get(verb, 0) + int(value)
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--tenants", type=int, default=5, help="namespaces the runs are spread over")
    parser.add_argument("--noise", type=int, default=3000, help="noisy tenants' pods")
    parser.add_argument("--noise-namespaces", type=int, default=3)
    parser.add_argument("--annotation-kb", type=int, default=32, help="each noise pod's annotation")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    external = os.environ.get("MLBENCH_TEST_KUBECONFIG")
    cluster = LocalCluster(Path(external).parent) if external else LocalCluster()
    started = cluster.up(timeout=300)
    kubectl = os.environ.get("MLBENCH_KUBECTL", str(kubectl_path()))
    op: Operator | None = None
    try:
        install_crds(KubeCluster(cluster.kubeconfig, kubectl, started, ()))
        bench = Bench(cluster.kubeconfig, kubectl)
        bench.kubectl("apply", "-f", "-", input=json.dumps(h.task()))
        load = TenantLoad(bench, cluster, args)
        noise_s = load.noise()
        print(f"noise: {args.noise} pods created in {noise_s}s", file=sys.stderr, flush=True)
        limit = shipped_memory_limit()
        log = Path(tempfile.gettempdir()) / "mlbench-operator-tenant-load.log"
        log.unlink(missing_ok=True)
        op = Operator(cluster.kubeconfig, memory_bytes(limit), log)
        print(f"operator pid {op.proc.pid}, log {log}", file=sys.stderr, flush=True)
        load.apply_runs()
        result = load.drive(op)
        requests = op.stop()
        result |= {
            "operator": {
                "peak_rss_mib": round(op.peak_rss_kb / 1024, 1),
                "kills": op.kills,
                "unexpected_exits": op.unexpected_exits,
                "start_to_metrics_s": op.starts_s,
                "requests_by_verb": by_verb(requests),
                "pod_creates": by_code(requests, "POST pods"),
                "requests": {k: int(v) for k, v in sorted(requests.items())},
            }
        }
        op = None
        result |= {
            "command": " ".join([Path(sys.executable).name, "benchmarks/tenant_load.py", *(argv or sys.argv[1:])]),
            "args": vars(args) | {"json": str(args.json)},
            "noise_create_s": noise_s,
            "memory_limit": limit,
            "memory_cap": f"prlimit --data={memory_bytes(limit)}",
        }
        print(json.dumps(result), flush=True)
        load.cleanup()
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    finally:
        if op is not None:
            op.stop()
        if started:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
