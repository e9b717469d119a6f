"""Operator scale benchmark: time from ``kubectl apply`` to a world of N Running workers, and API cost.

For each N (default 64, 256, 1000) it applies one BenchmarkRun with N workers on the local kwok
control plane (tests/cluster) and reports

* ``pods_running_s``: apply -> every worker pod ``Running`` (as an independent observer sees it),
* ``status_ready_s``: apply -> ``status.workers.ready == N`` (what ``kubectl get br`` shows),
* ``launcher_running_s``: apply -> ``status.phase == Running`` (launcher created after all Ready),
* ``operator_requests``: API requests the operator's reconciler made for this run, by verb, resource and
  status code (``by_kind``: ``"POST pods 201"``, ``"POST pods 409"``; from its own
  ``mlbench_operator_api_requests_total``; kopf's watch streams are not counted),
* ``gang_restart_s`` / ``restart_requests``: worker 0 then fails (kwok exit code 1); time until the
  whole world was deleted, recreated and is Running again, and the requests that took,
* ``floor_s`` / ``ratio``: right before each run, the same number of bare pods of the workers' shape
  created straight to the API server by a plain 32-thread client (the cluster's floor), and
  ``pods_running_s / floor_s`` (issue 10's target: at most 1.2),
* ``timeline`` (floor and run): when the observer first saw a pod (its create, give or take the
  watch's latency), and when the first, median and last pod turned Running, seconds from the start;
  ``watch_events``: the pod events the observer got (the operator's pod watch gets the same ones),
* ``work_ratio``: the CPU seconds the run took of the cluster, the operator and this client, over the
  floor's (on a saturated machine with nothing else running, about ``ratio``; less noisy than it),
* ``cpu_s`` (floor and run, apply -> all Running): CPU seconds each process used (``/proc/<pid>/stat``):
  the operator, every control-plane component (pid files of the tests/cluster dir beside the
  kubeconfig), this benchmark (the floor's client threads, the observer), ``machine`` (all of the
  machine's busy CPU, ``/proc/stat``) and ``others`` (machine minus the named ones: other work on a
  shared machine, a sign of a noisy figure); ``cpus`` is the machine's CPU count,

then ``--many`` runs x workers (default 20 x 50) applied together: all Running, and the operator's
API requests per run.

The observer is one LIST + WATCH of the namespace's pods (``--observer watch``, the default: as cheap
for the API server as any controller); ``--observer poll`` LISTs the pods every 0.2 s instead (the
benchmark's first observer; a 1000-pod LIST five times a second costs the API server and this process
CPU that the pods then wait for, the floor's and the run's alike).

``--profile PATH`` records the operator with py-spy (``--py-spy EXE``, default ``py-spy`` on PATH;
not a dependency of the project: ``pip install --target /tmp/pyspy py-spy``) from apply to all Running
(threads that are not idle; on a saturated machine that includes waiting for a CPU or for the GIL, so
compare shares within one thread's stacks, e.g. the event loop's, those under ``BaseEventLoop._run_once``):
PATH ``.json`` = speedscope, ``.svg`` = flame graph, else py-spy's raw collapsed stacks; the worker count
goes into the name (``prof.txt`` -> ``prof-1000.txt``).

Usage::

    python benchmarks/operator_scale.py                      # starts the local cluster if needed
    python benchmarks/operator_scale.py --workers 64 256 --json out.json
    python benchmarks/operator_scale.py --workers 1000 --no-restart --repeat 3   # the issue's ratio, thrice
    MLBENCH_TEST_KUBECONFIG=~/.kube/config python benchmarks/operator_scale.py

Not a test: it prints figures and asserts nothing beyond each run reaching Running.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for sub in ("crds", "operator", "runners", ""):
    sys.path.insert(0, str(REPO / sub))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from mlbench_operator import runpods  # noqa: E402
from mlbench_operator.kube import Kube, load_configuration  # noqa: E402
from mlbench_operator.run import admission  # noqa: E402
from tests.cluster.cluster import free_port  # noqa: E402
from tests.operator import helpers as h  # noqa: E402

#: The control plane's processes, as tests/cluster names their pid files.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
CLK_TCK = os.sysconf("SC_CLK_TCK")


#: How requests are counted: by verb, resource and status code ("POST pods 409": a create of a pod that existed).
REQUEST_LABELS = ("verb", "resource", "code")


def metric_sums(text: str, name: str, *labels: str) -> dict[str, float]:
    """One counter of a Prometheus text exposition, summed by ``labels`` (their values joined by a space)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                key = " ".join(s.labels[k] for k in labels)
                out[key] = out.get(key, 0.0) + s.value
    return out


def operator_metric(port: int, name: str, *labels: str) -> dict[str, float]:
    """One counter of the operator's /metrics, summed by ``labels`` (joined by a space)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return metric_sums(resp.read().decode(), name, *labels)


def operator_requests(port: int) -> dict[str, float]:
    return operator_metric(port, "mlbench_operator_api_requests_total", *REQUEST_LABELS)


def operator_events(port: int) -> float:
    """Watch events the operator's handlers got (all resources); 0 for an operator without the counter."""
    return sum(operator_metric(port, "mlbench_operator_watch_events_total", "resource").values())


def apiserver_metrics(kube: Kube) -> str:
    """The API server's /metrics text (parsed later by :func:`apiserver_requests`: it takes a while)."""
    text: str = kube.request("GET", "/metrics", raw=True, resource="bench")
    return text


def apiserver_requests(text: str) -> dict[str, float]:
    """Every client's requests the API server has served (its ``apiserver_request_total``), by verb, resource
    and status code ("POST pods 201", "POST pods 409", "PATCH pods/status 200"); watches count once, when
    they start."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "apiserver_request_total" and s.labels.get("resource"):
                sub = f"/{s.labels['subresource']}" if s.labels.get("subresource") else ""
                key = f"{s.labels['verb']} {s.labels['resource']}{sub} {s.labels.get('code', '')}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def requests_delta(before: dict[str, float], after: dict[str, float], least: int = 5) -> dict[str, int]:
    """The counts that grew by at least ``least`` (the rest is background: leases, health checks)."""
    grown = {k: int(v - before.get(k, 0.0)) for k, v in after.items()}
    return {k: v for k, v in sorted(grown.items()) if v >= least}


def bare_worker_pods(
    namespace: str, count: int, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """``count`` pods of the shape of a run's workers (as the operator builds them), with no run behind them:
    no ownerReference, ``labels`` instead of the operator's (None: keep the operator's), ``annotations`` added."""
    body = h.run("floor", namespace, workers=count, resources={"cpu": "10m", "memory": "16Mi"})
    admitted = admission.admit(body, h.task())
    assert not isinstance(admitted, admission.Rejection), admitted
    pods = []
    for rank in range(count):
        pod = runpods.worker_pod(admitted[0], rank, 0)
        pod["metadata"].pop("ownerReferences", None)  # no run behind them
        if labels is not None:
            pod["metadata"]["labels"] = dict(labels)
        if annotations:
            pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **annotations}
        pods.append(pod)
    return pods


def start_operator(
    kubeconfig: Path, port: int, selector: str, log: Path, wrapper: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """The operator of this checkout as a process (the only replica, no liveness server) that reconciles the runs
    labelled ``selector``, its log appended to ``log``; ``wrapper`` goes before the command (e.g. ``prlimit``, which
    execs it: the pid is the operator's); returns once its /metrics answer."""
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PYTHONPATH": os.pathsep.join(str(REPO / s) for s in ("crds", "operator", "runners", "")),
    }
    argv = [
        *wrapper,
        sys.executable,
        "-m",
        "mlbench_operator.main",
        f"--metrics-port={port}",
        "--liveness=",
        f"--selector={selector}",  # leave other runs on the cluster alone
        "--no-leader-elect",  # the only replica
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            operator_requests(port)
            return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"operator did not start; see {log}") from None
            time.sleep(0.3)


# -- CPU accounting ------------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/<pid>/stat``); 0.0 when it is gone."""
    return cpu_seconds_of(Path(f"/proc/{pid}/stat"))


def cpu_seconds_of(stat: Path) -> float:
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14 and 15
    except (OSError, IndexError, ValueError):
        return 0.0


def main_thread_seconds(pid: int) -> float:
    """CPU seconds of a process's main thread (the operator's event loop: kopf and the reconcilers); the
    rest of the process's are its threads' (the API pool's requests)."""
    return cpu_seconds_of(Path(f"/proc/{pid}/task/{pid}/stat"))


def machine_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``: all but idle and iowait)."""
    try:
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return 0.0
    values = [int(v) for v in cpu[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(values) - values[3] - values[4]) / CLK_TCK


def settle(max_wait: float, busy_cores: float = 0.3, window: float = 3.0) -> float:
    """Wait (up to ``max_wait`` seconds) for a ``window`` in which the whole machine is nearly idle (at most
    ``busy_cores`` busy: the idle cluster uses a few hundredths), so that a measurement does not start in
    the middle of someone else's work on a shared machine; returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        before = machine_busy_seconds()
        time.sleep(window)
        if (machine_busy_seconds() - before) / window <= busy_cores or time.monotonic() - t0 >= max_wait:
            return round(time.monotonic() - t0, 1)


class CpuMeter:
    """CPU seconds by process over a phase: the control plane's components, the operator, this benchmark."""

    def __init__(self, kubeconfig: Path) -> None:
        self.pids: dict[str, int] = {}
        for component in COMPONENTS:  # tests/cluster keeps pid files beside the kubeconfig
            with contextlib.suppress(OSError, ValueError, IndexError):
                self.pids[component] = int((kubeconfig.parent / "pids" / f"{component}.pid").read_text().split()[0])

    def sample(self) -> dict[str, float]:
        out = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        out["bench"] = time.process_time()
        out["machine"] = machine_busy_seconds()
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        out = {k: round(after[k] - before.get(k, 0.0), 2) for k in after}
        known = sum(v for k, v in out.items() if k not in ("machine", "operator_loop"))  # the loop: in operator
        out["others"] = round(out.get("machine", 0.0) - known, 2)
        out["cpus"] = os.cpu_count() or 1
        return out


# -- the observer --------------------------------------------------------------------------------------------
class PodWatch:
    """An independent observer of a namespace's pods matching a selector: one LIST, then a WATCH, in a
    thread; when each pod was first seen and first ``Running`` (``time.monotonic()``)."""

    def __init__(self, kube: Kube, namespace: str, selector: str) -> None:
        self.kube = kube
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.selector = selector
        self.seen: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.events = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._listed = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._loop, name="pod-watch", daemon=True)
        self._thread.start()
        if not self._listed.wait(30):
            raise TimeoutError(f"the observer could not list {self.path}")

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # best effort: it is a daemon thread
                resp.shutdown()  # unblocks the thread's read
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.kube.request("GET", self.path, query=[("labelSelector", self.selector)], resource="bench")
                for pod in listed["items"]:
                    self._saw("ADDED", pod)
                self._listed.set()
                self._watch(listed["metadata"]["resourceVersion"])
            except Exception:  # a dropped stream: list and watch again
                if self._stop.is_set():
                    return
                time.sleep(0.2)

    def _watch(self, resource_version: str) -> None:
        query = [
            ("labelSelector", self.selector),
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", "900"),
        ]
        _, url, headers, _, _ = self.kube.api.param_serialize(
            method="GET",
            resource_path=self.path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        resp = self.kube.api.call_api("GET", url, headers, _request_timeout=(5, 1000)).response
        self._resp = resp
        try:
            rest = b""
            for chunk in resp.stream(None, decode_content=True):
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: list again
                        return
                    self._saw(event["type"], event["object"])
                if self._stop.is_set():
                    return
        finally:
            self._resp = None
            resp.release_conn()

    def _saw(self, kind: str, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        name = pod["metadata"]["name"]
        with self._cond:
            self.events += 1
            if kind == "DELETED":
                return
            self.seen.setdefault(name, now)
            if (pod.get("status") or {}).get("phase") == "Running" and name not in self.running:
                self.running[name] = now
                self._cond.notify_all()

    def running_at(self, count: int) -> float | None:
        """When the ``count``-th pod turned Running (None: not yet)."""
        with self._cond:
            if len(self.running) < count:
                return None
            return sorted(self.running.values())[count - 1]

    def wait_running(self, count: int, t0: float, timeout: float) -> float:
        """Seconds from ``t0`` until ``count`` pods were Running."""
        with self._cond:
            while len(self.running) < count:
                left = t0 + timeout - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.running)} of {count} pods Running after {timeout}s")
                self._cond.wait(min(left, 1.0))
        at = self.running_at(count)
        assert at is not None
        return at - t0

    def timeline(self, t0: float) -> dict[str, Any]:
        with self._cond:
            seen = sorted(v - t0 for v in self.seen.values())
            running = sorted(v - t0 for v in self.running.values())
            events = self.events
        if not seen or not running:
            return {"watch_events": events}
        return {
            "first_seen_s": round(seen[0], 2),
            "last_seen_s": round(seen[-1], 2),
            "first_running_s": round(running[0], 2),
            "median_running_s": round(statistics.median(running), 2),
            "last_running_s": round(running[-1], 2),
            "watch_events": events,
        }


class Profiler:
    """py-spy recording a process until stopped (SIGINT makes it write the profile)."""

    def __init__(self, exe: str, pid: int, out: Path, rate: int = 100) -> None:
        fmt = {".json": "speedscope", ".svg": "flamegraph"}.get(out.suffix, "raw")
        self.out = out
        argv = [exe, "record", "--pid", str(pid), "--output", str(out), "--format", fmt, "--rate", str(rate)]
        self.proc = subprocess.Popen(
            [*argv, "--nonblocking"],  # never pauses the operator to sample it
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stop(self) -> None:
        """Stop sampling now (py-spy then writes the profile: :meth:`wait`)."""
        self.proc.send_signal(signal.SIGINT)

    def wait(self) -> None:
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            err = b""
        if self.proc.returncode not in (0, -signal.SIGINT):
            print(f"py-spy exited with {self.proc.returncode}: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
        else:
            print(f"profile: {self.out}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, kubeconfig: Path, kubectl: str, observer: str = "watch") -> None:
        self.kubeconfig = kubeconfig
        self.kubectl_bin = kubectl
        self.kube = Kube(load_configuration(str(kubeconfig)))
        self.observer = observer
        self.cpu = CpuMeter(kubeconfig)
        self.profile: Path | None = None
        self.py_spy = "py-spy"

    def kubectl(self, *args: str, input: str | None = None) -> str:
        res = subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=True,
        )
        return res.stdout

    def count_running(self, ns: str, selector: str) -> int:
        pods = self.kube.request(
            "GET", f"/api/v1/namespaces/{ns}/pods", query=[("labelSelector", selector)], resource="bench"
        )
        return sum(1 for p in pods["items"] if (p.get("status") or {}).get("phase") == "Running")

    def wait_running(self, ns: str, selector: str, count: int, t0: float, timeout: float) -> float:
        """``--observer poll``: LIST every 0.2 s until ``count`` pods are Running; seconds from ``t0``."""
        while self.count_running(ns, selector) < count:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{ns}: {count} pods ({selector}) not Running after {timeout}s")
            time.sleep(0.2)
        return time.monotonic() - t0

    def watch(self, ns: str, selector: str) -> PodWatch | None:
        return PodWatch(self.kube, ns, selector) if self.observer == "watch" else None

    def floor(self, workers: int, timeout: float, threads: int = 32) -> dict[str, Any]:
        """The cluster's own floor: ``workers`` bare pods of the same shape as a run's workers, created
        straight to the API server by a plain ``threads``-thread client; seconds until all are Running."""
        ns = f"floor-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", ns)
        # not the operator's labels: its pod watch must not see (or slow) the floor
        pods = bare_worker_pods(ns, workers, {"mlbench.io/run": "floor", "mlbench.io/role": "worker"})
        selector = "mlbench.io/run=floor,mlbench.io/role=worker"
        watch = self.watch(ns, selector)
        api0 = apiserver_metrics(self.kube)
        cpu0 = self.cpu.sample()
        t0 = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(self.kube.create, pods))
        out: dict[str, Any] = {}
        if watch is not None:
            took = watch.wait_running(workers, t0, timeout)
            out["cpu_s"] = CpuMeter.delta(cpu0, self.cpu.sample())
            out["timeline"] = watch.timeline(t0)
            watch.stop()
        else:
            took = self.wait_running(ns, selector, workers, t0, timeout)
            out["cpu_s"] = CpuMeter.delta(cpu0, self.cpu.sample())
        out["floor_s"] = round(took, 2)
        out["apiserver_requests"] = requests_delta(
            apiserver_requests(api0), apiserver_requests(apiserver_metrics(self.kube))
        )
        self.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s")
        return out

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
        watch = self.watch(ns, "mlbench.io/role=worker")
        t0 = time.monotonic()
        self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(b) for b in bodies))
        if watch is not None:
            took = watch.wait_running(runs * workers, t0, timeout)
            watch.stop()
        else:
            took = self.wait_running(ns, "mlbench.io/role=worker", runs * workers, t0, timeout)
        time.sleep(2.0)
        after = operator_requests(port)
        total = int(sum(after.values()) - sum(before.values()))
        self.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s")
        return {"runs": runs, "workers": workers, "all_running_s": round(took, 2), "requests_per_run": total / runs}

    def one(self, workers: int, port: int, timeout: float, restart: bool, operator_pid: int) -> dict[str, Any]:
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        run = f"scale{workers}"
        selector = f"mlbench.io/run={run},mlbench.io/role=worker"
        self.kubectl("create", "namespace", ns)
        body = h.run(run, ns, workers=workers, resources={"cpu": "10m", "memory": "16Mi"})
        body["metadata"]["labels"] = {"mlbench.io/benchmark": "operator-scale"}
        before = operator_requests(port)
        events0 = operator_events(port)
        watch = self.watch(ns, selector)
        profiler = None
        if self.profile is not None:
            out_path = self.profile.with_name(f"{self.profile.stem}-{workers}{self.profile.suffix}")
            profiler = Profiler(self.py_spy, operator_pid, out_path)
        api0 = apiserver_metrics(self.kube)
        cpu0 = self.operator_cpu(operator_pid)
        cpu_running: dict[str, float] | None = None
        api_running = ""
        t0 = time.monotonic()
        self.kubectl("apply", "-f", "-", input=json.dumps(body))
        marks: dict[str, float] = {}
        while len(marks) < 3:
            now = time.monotonic() - t0
            if now > timeout:
                raise TimeoutError(f"{workers} workers: not Running after {timeout}s ({marks})")
            if "pods_running_s" not in marks:
                if watch is not None:
                    at = watch.running_at(workers)
                    if at is not None:
                        marks["pods_running_s"] = at - t0
                elif self.count_running(ns, selector) == workers:
                    marks["pods_running_s"] = time.monotonic() - t0
                if "pods_running_s" in marks:
                    cpu_running = self.operator_cpu(operator_pid)
                    api_running = apiserver_metrics(self.kube)
                    if profiler is not None:
                        profiler.stop()
            st = self.run_status(ns, run)
            if "status_ready_s" not in marks and (st.get("workers") or {}).get("ready") == workers:
                marks["status_ready_s"] = time.monotonic() - t0
            if "launcher_running_s" not in marks and st.get("phase") == "Running":
                marks["launcher_running_s"] = time.monotonic() - t0
            time.sleep(0.05 if watch is not None and "pods_running_s" not in marks else 0.2)
        if profiler is not None:
            profiler.wait()
        time.sleep(1.0)  # let trailing status writes land before counting
        after = operator_requests(port)
        reqs = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
        out: dict[str, Any] = {
            "workers": workers,
            **{k: round(v, 2) for k, v in marks.items()},
            "operator_requests": int(sum(reqs.values())),
            "by_kind": {k: int(v) for k, v in sorted(reqs.items())},
            "operator_watch_events": int(operator_events(port) - events0),
        }
        if cpu_running is not None:
            out["cpu_s"] = CpuMeter.delta(cpu0, cpu_running)
            out["apiserver_requests"] = requests_delta(apiserver_requests(api0), apiserver_requests(api_running))
        if watch is not None:
            out["timeline"] = watch.timeline(t0)
            watch.stop()
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

    def operator_cpu(self, pid: int) -> dict[str, float]:
        """The meter's sample plus the operator's CPU seconds, and of that its event loop's."""
        return {**self.cpu.sample(), "operator": cpu_seconds(pid), "operator_loop": main_thread_seconds(pid)}

    def run_status(self, ns: str, run: str) -> dict[str, Any]:
        obj = self.kube.request("GET", f"/apis/mlbench.io/v1alpha1/namespaces/{ns}/benchmarkruns/{run}")
        return dict(obj.get("status") or {})


#: A measurement is noisy when processes other than the cluster's, the operator and this one used this share
#: of the machine's busy CPU.
NOISY = 0.1


def own_cpu(cpu: dict[str, float]) -> float:
    """CPU seconds of the cluster's processes, the operator and this benchmark (not the machine's others)."""
    return sum(v for k, v in cpu.items() if k not in ("machine", "others", "operator_loop", "cpus"))


def noisy(result: dict[str, Any]) -> bool:
    def share(cpu: dict[str, float]) -> float:
        return cpu.get("others", 0.0) / max(cpu.get("machine", 0.0), 1e-9)

    cpus = [c for c in (result.get("cpu_s"), result.get("floor", {}).get("cpu_s")) if c]
    return any(share(c) > NOISY for c in cpus)


def cpu_line(cpu: dict[str, float]) -> str:
    names = {
        "operator": "operator",
        "operator_loop": "(its event loop",
        "kube-apiserver": "apiserver",
        "etcd": "etcd",
        "kube-scheduler": "scheduler",
        "kwok": "kwok",
        "kube-controller-manager": "kcm",
        "bench": "bench",
    }
    parts = [f"{short} {cpu[k]:.1f}{')' if k == 'operator_loop' else ''}" for k, short in names.items() if k in cpu]
    return ", ".join(parts) + f"; machine {cpu.get('machine', 0):.1f} (others {cpu.get('others', 0):.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 256, 1000])
    parser.add_argument("--repeat", type=int, default=1, help="measure each worker count this many times")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--no-restart", action="store_true", help="skip the gang-restart measurement")
    parser.add_argument("--many", type=int, nargs=2, default=[20, 50], metavar=("RUNS", "WORKERS"))
    parser.add_argument("--no-many", action="store_true", help="skip the --many measurement")
    parser.add_argument("--observer", choices=("watch", "poll"), default="watch", help="see above")
    parser.add_argument(
        "--settle",
        type=float,
        default=120,
        metavar="SECONDS",
        help="before each floor and each run, wait up to this long for the machine to be nearly idle (0: not)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy the operator into PATH (see above)")
    parser.add_argument("--py-spy", default=os.environ.get("PY_SPY") or shutil.which("py-spy") or "py-spy")
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
        bench = Bench(kubeconfig, kubectl, args.observer)
        bench.profile, bench.py_spy = args.profile, args.py_spy
        bench.kubectl("apply", "-f", "-", input=json.dumps(h.task()))
        port = free_port()
        log = Path(tempfile.gettempdir()) / "mlbench-operator-scale.log"
        log.unlink(missing_ok=True)
        proc = start_operator(kubeconfig, port, "mlbench.io/benchmark=operator-scale", log)
        print(f"operator pid {proc.pid}, log {log}", file=sys.stderr, flush=True)
        results = []
        for n in args.workers:
            for _ in range(args.repeat):
                waited = settle(args.settle) if args.settle else 0.0
                floor = bench.floor(n, args.timeout)  # side by side: the floor right before the run
                waited += settle(args.settle) if args.settle else 0.0
                res = bench.one(n, port, args.timeout, not args.no_restart, proc.pid)
                res["settle_s"] = waited
                res["floor_s"] = floor.pop("floor_s")
                res["ratio"] = round(res["pods_running_s"] / res["floor_s"], 2)
                res["floor"] = floor
                if "cpu_s" in res and "cpu_s" in floor:  # CPU seconds of the cluster, operator and client
                    res["work_ratio"] = round(own_cpu(res["cpu_s"]) / max(own_cpu(floor["cpu_s"]), 1e-9), 2)
                results.append(res)
                print(json.dumps(res), flush=True)
        many = None
        if not args.no_many:
            many = bench.many(args.many[0], args.many[1], port, args.timeout)
            print(json.dumps(many), flush=True)
        print(
            f"\n{'workers':>8} {'floor':>7} {'pods Running':>13} {'ratio':>6} {'status ready':>13} {'launcher':>9}"
            f" {'op requests':>12} {'gang restart':>13} {'restart reqs':>13}"
        )
        for r in results:
            mark = "*" if noisy(r) else " "
            print(
                f"{r['workers']:>8} {r['floor_s']:>6.1f}s {r['pods_running_s']:>12.1f}s {r['ratio']:>5.2f}{mark}"
                f" {r['status_ready_s']:>12.1f}s {r['launcher_running_s']:>8.1f}s {r['operator_requests']:>12}"
                f" {r.get('gang_restart_s', float('nan')):>12.1f}s {r.get('restart_requests', 0):>13}"
            )
        if any(noisy(r) for r in results):
            print(f"* other work on the machine used over {NOISY:.0%} of its CPU during the floor or the run: noisy")
        print("\nCPU seconds, start -> all Running (floor: client in 'bench'; run: the operator's):")
        for r in results:
            if "cpu_s" in r["floor"] and "cpu_s" in r:
                print(f"{r['workers']:>8} floor: {cpu_line(r['floor']['cpu_s'])}")
                print(f"{'':>8} run:   {cpu_line(r['cpu_s'])}; work ratio {r['work_ratio']:.2f}")
        if many is not None:
            print(
                f"\n{many['runs']} runs x {many['workers']} workers applied together: all Running in "
                f"{many['all_running_s']:.1f}s, {many['requests_per_run']:.0f} operator API requests per run"
            )
        if args.json:
            args.json.write_text(json.dumps({"runs": results, "many": many}, indent=2))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        if local is not None and started:
            local.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
