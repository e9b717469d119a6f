"""Pure builder tests: names, owners, labels, resources, the exact hostfile (no cluster)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from mlbench_operator import builders, reconcile
from mlbench_operator import naming as n
from mlbench_operator.builders import RunContext
from mlbench_operator.sshkeys import generate_keypair
from tests.operator import helpers as h


def ctx_for(**kwargs: object) -> RunContext:
    task = h.task()
    task["spec"]["dataset"]["volume"] = {"persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}}
    result = reconcile.admit(h.run(**kwargs), task)  # type: ignore[arg-type]
    assert not isinstance(result, reconcile.Rejection), result
    return result[0]


def test_hostfile_is_exact() -> None:
    ctx = ctx_for(name="bench", namespace="team-a", workers=3, slotsPerWorker=2)
    assert builders.hostfile(ctx) == (
        "bench-worker-0.bench.team-a.svc slots=2\n"
        "bench-worker-1.bench.team-a.svc slots=2\n"
        "bench-worker-2.bench.team-a.svc slots=2\n"
    )


def test_every_object_is_owned_and_labelled() -> None:
    ctx = ctx_for(name="bench", namespace="team-a", workers=2)
    objs = [
        builders.service(ctx),
        builders.config_map(ctx),
        builders.ssh_secret(ctx, "PRIVATE", "PUBLIC"),
        builders.worker_pod(ctx, 0, 0),
        builders.launcher_pod(ctx, 0),
    ]
    names = [o["metadata"]["name"] for o in objs]
    assert names == ["bench", "bench-config", "bench-ssh", "bench-worker-0", "bench-launcher"]
    for obj in objs:
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "mlbench.io/v1alpha1",
                "kind": "BenchmarkRun",
                "name": "bench",
                "uid": "uid-bench",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"][n.LABEL_RUN] == "bench"
        assert meta["labels"][n.LABEL_TASK] == h.TASK_NAME
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "mlbench-operator"


def test_service_is_headless_and_publishes_not_ready() -> None:
    svc = builders.service(ctx_for(name="bench"))
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {n.LABEL_RUN: "bench", n.LABEL_ROLE: "worker"}


def test_config_map_carries_effective_config() -> None:
    ctx = ctx_for(name="bench", workers=4, seed=7, goal="light")
    data = builders.config_map(ctx)["data"]
    config = json.loads(data["config.json"])
    assert config["runName"] == "bench"
    assert config["worldSize"] == 4
    assert config["seed"] == 7
    assert config["goalTarget"] == 0.7
    assert data["hostfile"].count("\n") == 4


def test_worker_pod_shape() -> None:
    ctx = ctx_for(
        name="bench",
        workers=2,
        slotsPerWorker=2,
        backend="nccl",
        resources={"cpu": "4", "memory": "8Gi", "gpu": 2},
        scheduling={
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "benchmarks",
        },
        image="example/runner:1",
    )
    pod = builders.worker_pod(ctx, 1, 3)
    labels = pod["metadata"]["labels"]
    assert labels[n.LABEL_ROLE] == "worker"
    assert labels[n.LABEL_RANK] == "1"
    assert labels[n.LABEL_ATTEMPT] == "3"
    spec = pod["spec"]
    assert spec["hostname"] == "bench-worker-1"
    assert spec["subdomain"] == "bench"
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["priorityClassName"] == "benchmarks"
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["image"] == "example/runner:1"
    quantities = {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"}
    assert container["resources"] == {"requests": quantities, "limits": quantities}
    # worker 1 of a 2-slot world holds ranks 2 and 3; each rank's metrics port is named for it
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"ssh": 2222, "rank-2": 9400, "rank-3": 9401}
    assert container["readinessProbe"]["tcpSocket"] == {"port": "ssh"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLBENCH_RUN_CONFIG"] == "/etc/mlbench/config.json"
    assert env["MLBENCH_HOSTFILE"] == "/etc/mlbench/hostfile"
    assert "sshd" in container["command"][-1]
    assert "-p 2222" in container["command"][-1]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    assert volumes["config"]["configMap"]["name"] == "bench-config"
    assert volumes["ssh"]["secret"]["secretName"] == "bench-ssh"


@pytest.mark.parametrize(
    ("workers", "slots", "worker", "expected"),
    [
        (1, 1, 0, {"rank-0": 9400}),
        (4, 1, 3, {"rank-3": 9400}),
        (2, 2, 0, {"rank-0": 9400, "rank-1": 9401}),
        (2, 2, 1, {"rank-2": 9400, "rank-3": 9401}),
        (3, 4, 2, {"rank-8": 9400, "rank-9": 9401, "rank-10": 9402, "rank-11": 9403}),
    ],
)
def test_metrics_ports_are_named_for_global_ranks(workers: int, slots: int, worker: int, expected: dict) -> None:
    ctx = ctx_for(workers=workers, slotsPerWorker=slots)
    ports = builders.metrics_ports(ctx, worker)
    assert {p["name"]: p["containerPort"] for p in ports} == expected
    assert all(len(p["name"]) <= 15 for p in ports)  # IANA_SVC_NAME


def test_ranks_linger_for_the_last_scrape() -> None:
    ctx = ctx_for()
    for pod in (builders.worker_pod(ctx, 0, 0), builders.launcher_pod(ctx, 0)):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["MLBENCH_METRICS_LINGER_SECONDS"] == str(n.METRICS_LINGER_SECONDS)
    quiet = dataclasses.replace(ctx, metrics_linger_seconds=0)
    env = {e["name"]: e.get("value") for e in builders.launcher_pod(quiet, 0)["spec"]["containers"][0]["env"]}
    assert env["MLBENCH_METRICS_LINGER_SECONDS"] == "0"


def test_worker_without_resources_has_none() -> None:
    pod = builders.worker_pod(ctx_for(), 0, 0)
    assert pod["spec"]["containers"][0]["resources"] == {}
    assert pod["spec"]["containers"][0]["image"] == "mlbench/mlbench-runner:test"


def test_launcher_pod_shape() -> None:
    pod = builders.launcher_pod(ctx_for(name="bench"), 2)
    assert pod["metadata"]["labels"][n.LABEL_ROLE] == "launcher"
    assert n.LABEL_RANK not in pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["mlbench-runner", "launch"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert "resources" in container
    assert "nvidia.com/gpu" not in str(container["resources"])
    (init,) = pod["spec"]["initContainers"]
    assert init["name"] == "wait-for-workers"
    assert "getent hosts" in init["command"][-1]
    assert "/etc/mlbench/hostfile" in init["command"][-1]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_ssh_keys_are_fresh_per_run() -> None:
    priv1, pub1 = generate_keypair("a")
    priv2, pub2 = generate_keypair("b")
    assert priv1.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert pub1.startswith("ssh-ed25519 ")
    assert priv1 != priv2
    assert pub1 != pub2
    secret = builders.ssh_secret(ctx_for(), priv1, pub1)
    assert secret["stringData"] == {"id_ed25519": priv1, "id_ed25519.pub": pub1, "authorized_keys": pub1}


def test_image_user_mode_drops_non_root_settings() -> None:
    ctx = ctx_for()
    image_ctx = RunContext(ctx.name, ctx.namespace, ctx.uid, ctx.task_name, ctx.spec, ctx.config, run_as_user=None)
    pod = builders.worker_pod(image_ctx, 0, 0)
    assert "runAsUser" not in pod["spec"]["securityContext"]
    assert "runAsNonRoot" not in pod["spec"]["securityContext"]
    assert "capabilities" not in pod["spec"]["containers"][0]["securityContext"]
    default = builders.worker_pod(ctx, 0, 0)["spec"]["securityContext"]
    assert default["runAsUser"] == 1000
    assert default["runAsNonRoot"] is True
