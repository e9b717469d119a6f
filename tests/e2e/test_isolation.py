"""The run's NetworkPolicy, enforced: real connections to a training run's worker from pods of other namespaces,
from the scraper namespace, from the host's Prometheus address and from the run's own pods.

The test cluster enforces NetworkPolicy with kube-router on every real node (tests/cluster/README.md). While a
2-worker gloo run trains, every TCP port worker 0 listens on (sshd, rank 0's metrics, the TCPStore rendezvous,
gloo's own listeners) is probed:

* a pod of another namespace, on another node where there is one, reaches none of them;
* a pod of a scraper namespace (the operator's own, ``mlbench-system``) reaches the metrics port only;
* the host, whose address the e2e operator lists in ``MLBENCH_METRICS_CIDRS`` (a Prometheus outside any
  namespace, as the monitoring e2e runs it), reaches the metrics port only;
* worker 1, a pod of the run, reaches sshd, metrics and the rendezvous (the control: those ports were open at
  the time) -- and the run trains to Succeeded across nodes, so its own traffic, gloo's included, got through;
* worker 1 does not reach the API server (the run's egress: its own pods and DNS only), which a pod without the
  policy reaches (the fetch test's control).

And the fetch Job's policy: a pod bearing the fetch Job's label reaches the dataset server (a pod, in the blocks the
e2e operator lists in ``MLBENCH_FETCH_EGRESS_CIDRS``) and DNS, not the API server; the same pod without the label
reaches all three (the control).
"""

from __future__ import annotations

import json
import socket
import urllib.parse
from collections.abc import Iterable
from typing import Any

import pytest
import yaml

from mlbench_api import contract
from mlbench_operator import naming as n
from mlbench_operator.settings import DEFAULT_OPERATOR_NAMESPACE
from tests.cluster.plugin import (
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    create_namespace,
    port_probe,
    probe_results,
    wait_for,
)
from tests.e2e.conftest import BUSYBOX, E2E, wait_training

#: torch's default rendezvous port (MASTER_PORT): rank 0's TCPStore, on worker 0
RENDEZVOUS_PORT = 29500
#: /proc/net/tcp's state LISTEN, and the loopback addresses a listener is unreachable from outside at
LISTEN = "0A"
LOOPBACK = {"0100007F", "00000000000000000000000001000000"}
#: a Python probe for the runner image (no nc there): ``open PORT`` / ``closed PORT`` per port, as port_probe prints
PY_PROBE = (
    "import socket, sys\n"
    "for p in sys.argv[2:]:\n"
    "    try:\n"
    "        socket.create_connection((sys.argv[1], int(p)), timeout=3).close(); print('open', p)\n"
    "    except OSError:\n"
    "        print('closed', p)\n"
)


def listening_ports(proc_net_tcp: str) -> set[int]:
    """The TCP ports listening on a non-loopback address, from ``/proc/net/tcp`` and ``/proc/net/tcp6`` text."""
    ports = set()
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3] == LISTEN and ":" in fields[1]:
            address, port = fields[1].split(":")
            if address not in LOOPBACK:
                ports.add(int(port, 16))
    return ports


def test_listening_ports_are_read_from_proc_net_tcp() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue\n"
        "   0: 00000000:08AE 00000000:0000 0A 00000000:00000000\n"  # 0.0.0.0:2222 LISTEN
        "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000\n"  # 127.0.0.1:8080 LISTEN: loopback only
        "   2: 0A0D010A:08AE 0A0D020A:9C40 01 00000000:00000000\n"  # ESTABLISHED
        "   0: 00000000000000000000000000000000:24D8 00000000000000000000000000000000:0000 0A 0\n"  # [::]:9432
    )
    assert listening_ports(text) == {2222, 9432}


def _host_probe(ip: str, ports: Iterable[int]) -> dict[int, bool]:
    seen = {}
    for port in ports:
        try:
            socket.create_connection((ip, port), timeout=3).close()
            seen[port] = True
        except OSError:
            seen[port] = False
    return seen


def _probe_pod(
    name: str, node: str, command: str, scheduling: dict[str, Any], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    selector = {**scheduling.get("nodeSelector", {}), "kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": RESTRICTED_POD_CONTEXT,
            "containers": [
                {
                    "name": "probe",
                    "image": BUSYBOX,
                    "command": ["sh", "-c", command],
                    "securityContext": RESTRICTED_CONTAINER_CONTEXT,
                }
            ],
            "nodeSelector": selector,
            "tolerations": scheduling.get("tolerations", []),
        },
    }


def _pod_log_when_done(e2e: E2E, namespace: str, name: str) -> str:
    def done() -> bool:
        out = e2e.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False).stdout
        return bool(out) and json.loads(out)["status"].get("phase") in ("Succeeded", "Failed")

    wait_for(done, timeout=120, interval=1, what=f"probe pod {namespace}/{name} to finish")
    return e2e.kubectl("logs", name, "-n", namespace).stdout


@pytest.mark.cluster
@pytest.mark.realnode
@pytest.mark.e2e
@pytest.mark.slow
def test_only_the_runs_own_pods_reach_its_ports_and_scrapers_only_the_metrics(e2e: E2E, e2e_task: str) -> None:
    scheduling = {**e2e.scheduling, "placement": "Spread"}
    # a goal out of reach: the run trains all its epochs, still Running when the probes are done
    task = e2e.unreachable_goal(e2e_task)
    run = e2e.run("isolated", task, overrides={"maxEpochs": 4}, scheduling=scheduling)
    stranger = create_namespace(e2e.cluster)
    probes: list[tuple[str, str]] = []
    try:
        wait_training(e2e, run)
        worker0 = e2e.get("pod", f"{run}-worker-0")
        ip, node = worker0["status"]["podIP"], worker0["spec"]["nodeName"]
        other = next((n for n in e2e.real_nodes if n != node), node)
        proc = e2e.kubectl(
            "exec", f"{run}-worker-0", "-n", e2e.namespace, "--", "cat", "/proc/net/tcp", "/proc/net/tcp6"
        )
        ports = listening_ports(proc.stdout)
        named = {contract.SSH_PORT, contract.METRICS_PORT, RENDEZVOUS_PORT}
        assert named <= ports, f"worker 0 listens on {sorted(ports)}"
        gloo = ports - named
        assert gloo, f"no listener of gloo's on worker 0: {sorted(ports)}"
        everything = sorted(ports)
        for namespace, name in ((stranger, "stranger"), (DEFAULT_OPERATOR_NAMESPACE, f"{run}-scraper-probe")):
            pod = _probe_pod(name, other, port_probe(ip, everything, tries=5), e2e.scheduling)
            e2e.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
            probes.append((namespace, name))
        host = _host_probe(ip, everything)
        own = probe_results(
            e2e.kubectl(
                *("exec", f"{run}-worker-1", "-n", e2e.namespace, "--", "python3", "-c", PY_PROBE, ip),
                *(str(p) for p in sorted(named)),
            ).stdout
        )
        api_host, api_port = _api_server(e2e)
        outside = probe_results(
            e2e.kubectl(
                *("exec", f"{run}-worker-1", "-n", e2e.namespace, "--", "python3", "-c", PY_PROBE, api_host),
                str(api_port),
            ).stdout
        )
        seen = {name: probe_results(_pod_log_when_done(e2e, ns, name)) for ns, name in probes}
        assert e2e.status(run).get("phase") == "Running", "the run ended before the probes did: inconclusive"
        assert own == dict.fromkeys(named, True), own
        assert outside == {api_port: False}, outside  # egress: the run's own pods and DNS only
        assert seen["stranger"] == dict.fromkeys(everything, False), seen
        scraper = seen[f"{run}-scraper-probe"]
        assert scraper == {p: p == contract.METRICS_PORT for p in everything}, scraper
        assert host == {p: p == contract.METRICS_PORT for p in everything}, host
        print(f"\n{run}: worker 0 listens on {everything} (gloo {sorted(gloo)}); enforced as the policy says")
        st = e2e.wait_finished(run)
        assert st.get("phase") == "Succeeded", f"{json.dumps(st)[:2000]}\n{e2e.debug(run)}"
    finally:
        for namespace, name in probes:
            e2e.kubectl("delete", "pod", name, "-n", namespace, "--wait=false", check=False)
        e2e.kubectl("delete", "namespace", stranger, "--wait=false", check=False)
        e2e.kubectl("delete", "benchmarkrun", run, "-n", e2e.namespace, "--wait=false", check=False)


def _api_server(e2e: E2E) -> tuple[str, int]:
    """The API server's host and port, from the test cluster's kubeconfig (reachable from a pod without a policy)."""
    config = yaml.safe_load(e2e.cluster.kubeconfig.read_text())
    api = urllib.parse.urlsplit(config["clusters"][0]["cluster"]["server"])
    assert api.hostname, api
    assert api.port is not None, api
    assert api.port not in (8080, 53), api
    return api.hostname, api.port


def _fetch_job_selected(e2e: E2E) -> str | None:
    """The Job name a fetch Job's NetworkPolicy in the e2e namespace selects (None while there is none)."""
    items = json.loads(e2e.kubectl("get", "networkpolicy", "-n", e2e.namespace, "-o", "json").stdout)["items"]
    names = [p["spec"]["podSelector"].get("matchLabels", {}).get(n.LABEL_JOB_NAME) for p in items]
    return next((name for name in names if name), None)


@pytest.mark.cluster
@pytest.mark.realnode
@pytest.mark.e2e
@pytest.mark.slow
def test_a_fetch_job_reaches_its_source_and_dns_and_not_the_api_server(e2e: E2E, e2e_task: str) -> None:
    run = e2e.run("fetch-egress", e2e_task, overrides={"maxEpochs": 1})  # its dataset is fetched in this namespace
    probes: list[str] = []
    try:
        job = wait_for(lambda: _fetch_job_selected(e2e), timeout=120, interval=1, what="the fetch Job's policy")
        server = e2e.get("pod", "datasets")
        api_host, api_port = _api_server(e2e)
        # the probes wait for kube-router to have the new pod's egress rules: until then a new pod is unfiltered,
        # and a probe stops at its first open connection
        command = "sleep 6; " + "; ".join(
            port_probe(ip, [port], tries=5)
            for ip, port in ((server["status"]["podIP"], 8080), (api_host, 53), (api_host, api_port))
        )
        node = server["spec"]["nodeName"]
        for name, labels in (("fetch-like", {n.LABEL_JOB_NAME: job}), ("unlabelled", {})):
            pod = _probe_pod(f"{run}-{name}", node, command, e2e.scheduling, labels)
            e2e.kubectl("apply", "-n", e2e.namespace, "-f", "-", input=json.dumps(pod))
            probes.append(f"{run}-{name}")
        seen = {name: probe_results(_pod_log_when_done(e2e, e2e.namespace, name)) for name in probes}
        assert seen[f"{run}-unlabelled"] == {8080: True, 53: True, api_port: True}, seen
        assert seen[f"{run}-fetch-like"] == {8080: True, 53: True, api_port: False}, seen
        print(f"\nfetch Job {job}'s policy: source and DNS reached, the API server at {api_host}:{api_port} not")
    finally:
        for name in probes:
            e2e.kubectl("delete", "pod", name, "-n", e2e.namespace, "--wait=false", check=False)
        e2e.kubectl("delete", "benchmarkrun", run, "-n", e2e.namespace, "--wait=false", check=False)
