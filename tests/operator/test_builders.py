"""Pure builder tests: names, owners, labels, resources, the exact hostfile (no cluster)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from mlbench_api import bundle, contract
from mlbench_operator import naming as n
from mlbench_operator import podscheduling, runobjects, runpods
from mlbench_operator.run import admission
from mlbench_operator.runcontext import RunContext
from mlbench_operator.sshkeys import RunKeys, generate_keypair
from tests.operator import helpers as h

#: Stand-ins for a run's keys where no ssh-keygen is needed.
FAKE_KEYS = RunKeys("CLIENT-PRIVATE", "ssh-ed25519 CLIENT c\n", "HOST-PRIVATE", "ssh-ed25519 HOST h\n")


def ctx_for(**kwargs: object) -> RunContext:
    task = h.task()
    task["spec"]["dataset"]["volume"] = {"persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}}
    result = admission.admit(h.run(**kwargs), task, policy=h.PERMISSIVE)  # type: ignore[arg-type]
    assert not isinstance(result, admission.Rejection), result
    return result[0]


def test_hostfile_is_exact() -> None:
    ctx = ctx_for(name="bench", namespace="team-a", workers=3, slotsPerWorker=2)
    assert runobjects.hostfile(ctx) == (
        "bench-worker-0.bench.team-a.svc slots=2\n"
        "bench-worker-1.bench.team-a.svc slots=2\n"
        "bench-worker-2.bench.team-a.svc slots=2\n"
    )


def test_every_object_is_owned_and_labelled() -> None:
    ctx = ctx_for(name="bench", namespace="team-a", workers=2)
    objs = [
        runobjects.service(ctx),
        runobjects.config_map(ctx),
        runobjects.ssh_secret(ctx, FAKE_KEYS),
        runpods.worker_pod(ctx, 0, 0),
        runpods.launcher_pod(ctx, 0),
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
    svc = runobjects.service(ctx_for(name="bench"))
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {n.LABEL_RUN: "bench", n.LABEL_ROLE: "worker"}


def test_config_map_carries_effective_config() -> None:
    ctx = ctx_for(name="bench", workers=4, seed=7, goal="light")
    data = runobjects.config_map(ctx)["data"]
    config = json.loads(data["config.json"])
    assert config["runName"] == "bench"
    assert config["worldSize"] == 4
    assert config["seed"] == 7
    assert config["goalTarget"] == 0.7
    assert data["hostfile"].count("\n") == 4


def test_run_config_maps_are_immutable() -> None:
    """Nothing rewrites a run's hostfile/config or its kept results: immutable (kubelet stops watching)."""
    ctx = ctx_for(name="bench")
    assert runobjects.config_map(ctx)["immutable"] is True
    kept = runobjects.results_config_map("bench", "team-a", "uid-bench", "t", bundle.fit({bundle.SUMMARY: b"{}"}))
    assert kept["immutable"] is True


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        (None, {}),
        ("Any", {}),
        (
            "OneWorkerPerNode",
            {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": "WORLD", "topologyKey": "kubernetes.io/hostname"}
                        ]
                    }
                }
            },
        ),
        (
            "Spread",
            {
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": "WORLD",
                    }
                ]
            },
        ),
    ],
)
def test_worker_placement_is_over_one_world(placement: str | None, expected: dict[str, object]) -> None:
    scheduling = {"placement": placement} if placement else None
    ctx = ctx_for(name="bench", workers=3, scheduling=scheduling)
    world = {"matchLabels": {n.LABEL_RUN: "bench", n.LABEL_ROLE: "worker", n.LABEL_ATTEMPT: "2"}}
    want = json.loads(json.dumps(expected).replace('"WORLD"', json.dumps(world)))
    pod = runpods.worker_pod(ctx, 1, 2)
    assert {k: pod["spec"][k] for k in ("affinity", "topologySpreadConstraints") if k in pod["spec"]} == want
    # the selector matches this world's workers (itself included), never the launcher or another attempt
    if want:
        assert world["matchLabels"].items() <= pod["metadata"]["labels"].items()
        launcher = runpods.launcher_pod(ctx, 2)["spec"]
        assert "affinity" not in launcher
        assert "topologySpreadConstraints" not in launcher


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
    pod = runpods.worker_pod(ctx, 1, 3)
    labels = pod["metadata"]["labels"]
    assert labels[n.LABEL_ROLE] == "worker"
    assert labels[n.LABEL_RANK] == "1"
    assert labels[n.LABEL_ATTEMPT] == "3"
    spec = pod["spec"]
    assert spec["hostname"] == "bench-worker-1"
    assert spec["subdomain"] == "bench"
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"][0] == {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert spec["tolerations"][1:] == podscheduling.node_loss_tolerations(
        60, []
    )  # the operator's MLBENCH_NODE_LOSS_SECONDS
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
    ports = runpods.metrics_ports(ctx, worker)
    assert {p["name"]: p["containerPort"] for p in ports} == expected
    assert all(len(p["name"]) <= 15 for p in ports)  # IANA_SVC_NAME


@pytest.mark.parametrize(
    ("command", "ports"),
    [
        (None, ["ssh", "rank-0", "rank-1"]),  # the default, mlbench-runner train
        (["mlbench-runner", "collectives"], ["ssh", "rank-0", "rank-1"]),
        (["/opt/trainer/bin/train", "--fast"], ["ssh"]),  # not asked to serve metrics: no port to find down
    ],
)
def test_only_the_reference_runner_declares_metrics_ports(command: list[str] | None, ports: list[str]) -> None:
    task = h.task()
    task["spec"]["division"] = "open"
    if command is not None:
        task["spec"]["runner"]["command"] = command
    result = admission.admit(h.run(workers=1, slotsPerWorker=2), task, policy=h.PERMISSIVE)
    assert not isinstance(result, admission.Rejection), result
    container = runpods.worker_pod(result[0], 0, 0)["spec"]["containers"][0]
    assert [p["name"] for p in container["ports"]] == ports


def test_ranks_linger_for_the_last_scrape() -> None:
    ctx = ctx_for()
    for pod in (runpods.worker_pod(ctx, 0, 0), runpods.launcher_pod(ctx, 0)):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["MLBENCH_METRICS_LINGER_SECONDS"] == str(contract.METRICS_LINGER_SECONDS)
    quiet = dataclasses.replace(ctx, metrics_linger_seconds=0)
    env = {e["name"]: e.get("value") for e in runpods.launcher_pod(quiet, 0)["spec"]["containers"][0]["env"]}
    assert env["MLBENCH_METRICS_LINGER_SECONDS"] == "0"


def test_worker_without_resources_has_none() -> None:
    pod = runpods.worker_pod(ctx_for(), 0, 0)
    assert pod["spec"]["containers"][0]["resources"] == {}
    assert pod["spec"]["containers"][0]["image"] == "localhost/mlbench/mlbench-runner:test"


def test_launcher_pod_shape() -> None:
    pod = runpods.launcher_pod(ctx_for(name="bench"), 2)
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


@pytest.mark.multiproc
@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_ssh_keys_are_fresh_per_run() -> None:
    one, two = generate_keypair("mlbench-a"), generate_keypair("mlbench-b")
    for keys in (one, two):
        for private in (keys.client_private, keys.host_private):
            assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
        assert keys.client_public.startswith("ssh-ed25519 ")
        assert keys.host_public.startswith("ssh-ed25519 ")
        assert keys.client_public.split()[1] != keys.host_public.split()[1]  # two pairs, not one
        assert "PRIVATE" not in repr(keys)
    assert one.client_public.split()[2] == "mlbench-a"
    assert one.host_public.split()[2] == "mlbench-a-host"
    assert len({one.client_private, one.host_private, two.client_private, two.host_private}) == 4
    assert len({one.client_public, one.host_public, two.client_public, two.host_public}) == 4


def test_ssh_secret() -> None:
    """kubernetes.io/ssh-auth (its required key ssh-privatekey), immutable; authorized_keys is
    ``restrict``-ed; known_hosts names the run's host key under the run's alias, plain (no :2222)."""
    ctx = ctx_for(name="bench", namespace="team-a")
    secret = runobjects.ssh_secret(ctx, FAKE_KEYS)
    assert secret["type"] == "kubernetes.io/ssh-auth"
    assert secret["immutable"] is True
    assert secret["metadata"]["name"] == "bench-ssh"
    assert secret["stringData"] == {
        "ssh-privatekey": "CLIENT-PRIVATE",
        "authorized_keys": "restrict ssh-ed25519 CLIENT c\n",
        "ssh_host_ed25519_key": "HOST-PRIVATE",
        "known_hosts": "mlbench-workers.bench.team-a ssh-ed25519 HOST h\n",
    }
    assert n.ssh_host_key_alias("bench", "team-a") == "mlbench-workers.bench.team-a"


def test_worker_sshd_uses_the_run_host_key_and_timeouts() -> None:
    """No host key generated in the pod: sshd presents the Secret's (mounted) key, through its private copy."""
    script = runpods.worker_pod(ctx_for(), 0, 0)["spec"]["containers"][0]["command"][-1]
    assert script == runpods.WORKER_SCRIPT
    assert "ssh-keygen" not in script
    assert '(umask 077 && cat /etc/mlbench-ssh/ssh_host_ed25519_key > "$d/host_key"' in script
    assert ' -h "$d/host_key" ' in script
    assert "-o AuthorizedKeysFile=/etc/mlbench-ssh/authorized_keys" in script
    for option in ("LoginGraceTime=30", "ClientAliveInterval=15", "ClientAliveCountMax=4", "PasswordAuthentication=no"):
        assert f"-o {option}" in script


def test_workers_keep_the_client_key_where_the_launcher_does() -> None:
    """mpirun's tree spawn: the daemons on the workers start the next workers with the launcher's ssh options,
    ``-i <its private copy>``, so every worker keeps its copy of the client key at that very path."""
    from mlbench_runner.pod.launch import PRIVATE_SSH_DIR

    script = runpods.WORKER_SCRIPT
    assert f"d={PRIVATE_SSH_DIR}\n" in script
    assert f'cat /etc/mlbench-ssh/{contract.SSH_PRIVATE_KEY} > "$d/{contract.SSH_PRIVATE_KEY}")' in script


@pytest.mark.parametrize(("run_as_user", "mode"), [(1000, 0o440), (None, 0o444)])
def test_ssh_secret_volume_mode(run_as_user: int | None, mode: int) -> None:
    """The Secret's files are root's: 0440 + fsGroup for the operator's UID, 0444 under the image's own
    user (whoever it is must read them); sshd and ssh use private copies of the private keys."""
    ctx = dataclasses.replace(ctx_for(), run_as_user=run_as_user)
    for pod in (runpods.worker_pod(ctx, 0, 0), runpods.launcher_pod(ctx, 0)):
        (volume,) = [v for v in pod["spec"]["volumes"] if "secret" in v]
        assert volume["secret"] == {"secretName": f"{ctx.name}-ssh", "defaultMode": mode}
        if run_as_user is not None:
            assert pod["spec"]["securityContext"]["fsGroup"] == run_as_user


def test_ssh_environment_points_at_the_secret() -> None:
    """The launcher (and mpirun's tree spawn on workers) checks host keys against the run's known_hosts."""
    ctx = ctx_for(name="bench", namespace="team-a")
    for pod in (runpods.worker_pod(ctx, 0, 0), runpods.launcher_pod(ctx, 0)):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["MLBENCH_SSH_KEY"] == "/etc/mlbench-ssh/ssh-privatekey"
        assert env["MLBENCH_SSH_KNOWN_HOSTS"] == "/etc/mlbench-ssh/known_hosts"
        assert env["MLBENCH_SSH_HOST_KEY_ALIAS"] == "mlbench-workers.bench.team-a"
        assert env["MLBENCH_SSH_PORT"] == "2222"


def test_image_user_mode_drops_non_root_settings() -> None:
    ctx = ctx_for()
    image_ctx = RunContext(ctx.name, ctx.namespace, ctx.uid, ctx.task_name, ctx.spec, ctx.config, run_as_user=None)
    pod = runpods.worker_pod(image_ctx, 0, 0)
    assert "runAsUser" not in pod["spec"]["securityContext"]
    assert "runAsNonRoot" not in pod["spec"]["securityContext"]
    assert "capabilities" not in pod["spec"]["containers"][0]["securityContext"]
    default = runpods.worker_pod(ctx, 0, 0)["spec"]["securityContext"]
    assert default["runAsUser"] == 1000
    assert default["runAsNonRoot"] is True


@pytest.mark.parametrize(
    ("elapsed", "deadline", "expected"),
    [
        (None, 600, None),  # not started (no status.startTime)
        (0.0, None, None),  # no deadline
        (0.0, 600, 600),
        (100.4, 600, 500),  # ceil: never earlier than the run's own deadline
        (599.5, 600, 1),
        (700.0, 600, 1),  # already past: the API's minimum; the operator fails the run anyway
        (0.0, 2**31 - 1, 2**31 - 1),
    ],
)
def test_pods_carry_what_is_left_of_the_runs_deadline(
    elapsed: float | None, deadline: int | None, expected: int | None
) -> None:
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 1, 1, tzinfo=UTC)
    start = None if elapsed is None else now - timedelta(seconds=elapsed)
    assert runpods.pod_deadline(start, deadline, now) == expected
    ctx = ctx_for()
    for pod in (runpods.worker_pod(ctx, 0, 0, expected), runpods.launcher_pod(ctx, 0, expected)):
        assert pod["spec"].get("activeDeadlineSeconds") == expected


@pytest.mark.parametrize(
    ("command", "reference"),
    [
        (["mlbench-runner", "train"], True),
        (["/usr/local/bin/mlbench-runner", "train"], True),
        (["python", "-m", "mlbench_runner.cli", "train"], True),
        (["python3", "-m", "mlbench_runner"], True),
        (["/opt/trainer/bin/train"], False),
        (["python", "-m", "mytrainer"], False),
        (["mlbench-runner-fork"], False),
        ([], False),
    ],
)
def test_the_reference_runner_is_recognised_however_it_is_started(command: list[str], reference: bool) -> None:
    """It serves metrics on 9400 + local rank whatever the command's spelling: its ports must be declared."""
    from mlbench_api.task import RunnerSpec

    assert RunnerSpec(image="x", command=command).serves_metrics is reference


NODE_LOSS = [
    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
    for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
]


@pytest.mark.parametrize(
    ("seconds", "given", "added"),
    [
        (60, [], NODE_LOSS),
        (None, [], []),  # MLBENCH_NODE_LOSS_SECONDS=default: Kubernetes' own 300 s
        # the run's own toleration of one taint wins for that taint (forever, or its own seconds)
        (60, [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}], NODE_LOSS[1:]),
        (60, [{"key": "gpu", "operator": "Exists"}], NODE_LOSS),
    ],
)
def test_pods_leave_a_lost_node_after_the_operators_bound(
    seconds: int | None, given: list[dict[str, object]], added: list[dict[str, object]]
) -> None:
    assert podscheduling.node_loss_tolerations(seconds, given) == added


def test_every_pod_of_a_run_carries_the_node_loss_bound() -> None:
    ctx = dataclasses.replace(ctx_for(), node_loss_seconds=15)
    for pod in (runpods.worker_pod(ctx, 0, 0), runpods.launcher_pod(ctx, 0)):
        assert [t["tolerationSeconds"] for t in pod["spec"]["tolerations"]] == [15, 15]


def test_a_checkpointing_run_mounts_its_claim_on_the_workers_and_tells_the_runner_its_own_folder() -> None:
    ctx = ctx_for(name="bench", namespace="team-a", workers=2, checkpoint={"claimName": "ckpt"})
    worker, launcher = runpods.worker_pod(ctx, 1, 0), runpods.launcher_pod(ctx, 0)
    volumes = {v["name"]: v for v in worker["spec"]["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
    mounts = {m["name"]: m["mountPath"] for m in worker["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["checkpoints"] == contract.CHECKPOINT_DIR
    assert "checkpoints" not in {v["name"] for v in launcher["spec"]["volumes"]}  # the launcher does not train
    assert ctx.config.checkpoint_dir == f"{contract.CHECKPOINT_DIR}/team-a/bench-uid-bench"
    assert ctx.config.run_uid == "uid-bench"
    plain = ctx_for(name="bench", namespace="team-a", workers=2)
    assert plain.config.checkpoint_dir is None
    assert "checkpoints" not in {v["name"] for v in runpods.worker_pod(plain, 0, 0)["spec"]["volumes"]}


# -- spec.pod (issue 29) ---------------------------------------------------------------------------------------------
GPU_POD = {
    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_IB_HCA", "value": "mlx5"}],
    "annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"},
    "labels": {"team": "vision"},
    "extendedResources": {"rdma/hca_shared_devices_a": 1, "vpc.amazonaws.com/efa": 4},
}
ZONE_TERM = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}
USER_ANTI = {"labelSelector": {"matchLabels": {"app": "other"}}, "topologyKey": "kubernetes.io/hostname"}
ZONE_SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
OWN_SPREAD = {**ZONE_SPREAD, "labelSelector": {"matchLabels": {"team": "vision"}}}


def test_pod_settings_reach_the_workers() -> None:
    ctx = ctx_for(name="bench", resources={"cpu": 2, "gpu": 1}, backend="nccl", pod=GPU_POD)
    pod = runpods.worker_pod(ctx, 1, 0)
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_IB_HCA"] == "mlx5"
    assert env[contract.ENV_FORWARD_ENV] == "NCCL_DEBUG,NCCL_IB_HCA"
    want = {"cpu": "2", "nvidia.com/gpu": "1", "rdma/hca_shared_devices_a": "1", "vpc.amazonaws.com/efa": "4"}
    assert container["resources"] == {"requests": want, "limits": want}
    assert pod["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"][n.LABEL_RUN] == "bench"  # MLBench's own labels stay
    for absent in ("hostNetwork", "hostIPC", "dnsPolicy", "affinity"):
        assert absent not in pod["spec"]


def test_the_launcher_gets_the_env_not_the_rest() -> None:
    ctx = ctx_for(name="bench", resources={"gpu": 1}, backend="nccl", pod={**GPU_POD, "hostIpc": True})
    launcher = runpods.launcher_pod(ctx, 0)
    (container,) = launcher["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[contract.ENV_FORWARD_ENV] == "NCCL_DEBUG,NCCL_IB_HCA"  # mpirun -x needs them on the launcher
    assert "annotations" not in launcher["metadata"]
    assert "team" not in launcher["metadata"]["labels"]
    assert "rdma/hca_shared_devices_a" not in json.dumps(container["resources"])
    assert "hostIPC" not in launcher["spec"]


def test_no_pod_settings_add_nothing() -> None:
    pod = runpods.worker_pod(ctx_for(name="bench"), 0, 0)
    (container,) = pod["spec"]["containers"]
    assert contract.ENV_FORWARD_ENV not in {e["name"] for e in container["env"]}
    assert "annotations" not in pod["metadata"]


@pytest.mark.parametrize(
    ("placement", "given", "expected"),
    [
        # the user's node affinity and the placement's anti-affinity both hold
        (
            "OneWorkerPerNode",
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [ZONE_TERM]}
                    }
                }
            },
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [ZONE_TERM]}
                    },
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": ["WORLD-ANTI"]},
                }
            },
        ),
        # the user's own anti-affinity terms come first, the placement's is added
        (
            "OneWorkerPerNode",
            {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [USER_ANTI]}}},
            {
                "affinity": {
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [USER_ANTI, "WORLD-ANTI"]}
                }
            },
        ),
        # the placement's spread, then the user's
        (
            "Spread",
            {"topologySpreadConstraints": [ZONE_SPREAD]},
            {"topologySpreadConstraints": ["WORLD-SPREAD", "ZONE-WORLD"]},
        ),
        # a constraint without a labelSelector spreads this world's workers; one with its own keeps it
        (None, {"topologySpreadConstraints": [ZONE_SPREAD]}, {"topologySpreadConstraints": ["ZONE-WORLD"]}),
        (None, {"topologySpreadConstraints": [OWN_SPREAD]}, {"topologySpreadConstraints": [OWN_SPREAD]}),
        (
            "OneWorkerPerNode",
            {"hostNetwork": True, "hostIpc": True},
            {
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": ["WORLD-ANTI"]}},
                "hostNetwork": True,
                "dnsPolicy": "ClusterFirstWithHostNet",
                "hostIPC": True,
            },
        ),
        ("Any", {"hostIpc": True}, {"hostIPC": True}),
    ],
)
def test_pod_settings_merge_with_the_placement(
    placement: str | None, given: dict[str, object], expected: dict[str, object]
) -> None:
    ctx = ctx_for(name="bench", workers=3, scheduling={"placement": placement} if placement else None, pod=given)
    world = {"matchLabels": {n.LABEL_RUN: "bench", n.LABEL_ROLE: "worker", n.LABEL_ATTEMPT: "2"}}
    anti = {"labelSelector": world, "topologyKey": "kubernetes.io/hostname"}
    spread = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": world,
    }
    text = (
        json.dumps(expected)
        .replace('"WORLD-ANTI"', json.dumps(anti))
        .replace('"WORLD-SPREAD"', json.dumps(spread))
        .replace('"ZONE-WORLD"', json.dumps({**ZONE_SPREAD, "labelSelector": world}))
    )
    keys = ("affinity", "topologySpreadConstraints", "hostNetwork", "hostIPC", "dnsPolicy")
    spec = runpods.worker_pod(ctx, 1, 2)["spec"]
    assert {k: spec[k] for k in keys if k in spec} == json.loads(text)
