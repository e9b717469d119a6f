"""A real Kueue for the cluster tests: its manager (built from sigs.k8s.io/kueue by tests/cluster/build-kueue.sh)
as a host process against the test cluster, its CRDs installed from the same module source.

No webhook configuration is installed, so the API server never calls Kueue's webhooks (the operator does what
Kueue's job webhooks would: it keeps a queued run from starting until its Workload is admitted). The manager
still starts a webhook server and, with internalCertManagement disabled, reads a metrics certificate from a
fixed path (/etc/kueue/metrics/certs); both get a self-signed certificate made here. The fixed path is made
only inside a private mount namespace (``unshare -m``, an overlay on /etc), so the host's /etc is untouched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.cluster import free_port
from tests.cluster.plugin import KubeCluster, wait_for

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tests" / "cluster" / "build-kueue.sh"
NAMESPACE = "kueue-system"

#: Inside the private mount namespace: an overlay on /etc whose upper layer holds the metrics certificate.
_LAUNCH = """set -e
mount -t tmpfs kueue-scratch "$SCRATCH"
mkdir "$SCRATCH/upper" "$SCRATCH/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$SCRATCH/upper,workdir=$SCRATCH/work" /etc
mkdir -p /etc/kueue/metrics/certs
cp "$CERTS/tls.crt" "$CERTS/tls.key" /etc/kueue/metrics/certs/
exec "$KUEUE" --config="$CONFIG"
"""


def build() -> Path:
    """The install dir (bin/kueue, crds/); builds on first use (minutes), raises when it cannot."""
    out = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD} failed:\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


#: ``waitForPodsReady.timeout``: short, so that a run whose pods never become Ready is evicted within a test
#: (a run that starts, on kwok, has its launcher running a few seconds after its admission).
PODS_READY_TIMEOUT_SECONDS = 10


def config(health_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    """The manager's Configuration: no leader election, no metrics server, a webhook server nobody calls,
    the batch/job integration only (Kueue needs one; without the webhook it suspends nothing), no
    visibility server; ``waitForPodsReady`` on with a short timeout and a short requeuing backoff (the operator
    writes its Workloads' ``PodsReady``; test_cluster_kueue.py shows both sides of it)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        "waitForPodsReady": {
            "timeout": f"{PODS_READY_TIMEOUT_SECONDS}s",
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 1, "backoffMaxSeconds": 2},
        },
        # the visibility API server (pending workloads on demand) reads its certificate from /visibility and is
        # served through an APIService: not needed here
        "featureGates": {"VisibilityOnDemand": False},
    }


class KueueManager:
    """Kueue's manager in a subprocess; :meth:`start` returns once it reports ready."""

    def __init__(self, cluster: KubeCluster, install: Path, work: Path) -> None:
        self.cluster, self.install, self.work = cluster, install, work
        self.log_path = work / "kueue.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_port = free_port()

    def install_crds(self) -> None:
        """Kueue's CRDs (server-side apply: they are too large for the last-applied annotation)."""
        self.cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(self.install / "crds"), check=True
        )
        for crd in ("workloads", "clusterqueues", "localqueues", "resourceflavors"):
            wait_for(self._established(f"crd/{crd}.kueue.x-k8s.io"), timeout=60, what=f"{crd} Established")
        self.cluster.kubectl("create", "namespace", NAMESPACE)  # exists already: fine

    def _established(self, name: str) -> Callable[[], bool]:
        """Whether the CRD ``name`` serves yet (a wait on one the API server has not stored yet fails at once)."""
        return lambda: self.cluster.kubectl("wait", "--for=condition=Established", name).returncode == 0

    def _certificate(self) -> Path:
        certs = self.work / "certs"
        certs.mkdir(exist_ok=True)
        subj = ["-subj", "/CN=kueue", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
        files = ["-keyout", str(certs / "tls.key"), "-out", str(certs / "tls.crt")]
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", *subj, *files],
            check=True,
            capture_output=True,
        )
        return certs

    def start(self) -> None:
        certs = self._certificate()
        conf = self.work / "config.yaml"
        conf.write_text(yaml.safe_dump(config(self.health_port, free_port(), certs)))
        scratch = self.work / "scratch"
        scratch.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "SCRATCH": str(scratch),
            "CERTS": str(certs),
            "KUEUE": str(self.install / "bin" / "kueue"),
            "CONFIG": str(conf),
        }
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the subprocess
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", _LAUNCH],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._ready, timeout=120, interval=0.5, what="Kueue's manager ready")

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"kueue exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None  # the mount namespace went with the process

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
