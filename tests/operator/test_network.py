"""spec.network: refused unless the admin allows it; then every worker (never the launcher) gets the
netem init container, root with only NET_ADMIN, reading the run's config (no cluster needed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from mlbench_api import contract
from mlbench_operator import policy as p
from mlbench_operator import runobjects, runpods
from mlbench_operator.env import SettingsError
from mlbench_operator.run import admission
from mlbench_operator.runcontext import RunContext
from mlbench_operator.settings import OperatorConfig
from tests.operator import helpers as h
from tests.operator.test_pod_security import restricted_violations

NETWORK = {"bandwidthMbit": 100, "latencyMs": 5, "jitterMs": 1, "lossPercent": 0.1}
ALLOWED = dataclasses.replace(h.PERMISSIVE, allow_network_emulation=True)


def admit(policy: p.AdmissionPolicy, **spec: Any) -> RunContext | admission.Rejection:
    result = admission.admit(h.run(**spec), h.task(), policy=policy)
    return result if isinstance(result, admission.Rejection) else result[0]


def ctx_for(**spec: Any) -> RunContext:
    ctx = admit(ALLOWED, **spec)
    assert isinstance(ctx, RunContext), ctx
    return ctx


# -- the admission policy -------------------------------------------------------------------------------------------
def test_network_is_refused_by_default_with_field_and_setting_named() -> None:
    result = admit(p.AdmissionPolicy(), network={"latencyMs": 5})
    assert isinstance(result, admission.Rejection)
    assert result.reason == "PolicyViolation"
    assert result.message.startswith("spec.network: ")
    assert "MLBENCH_ALLOW_NETWORK_EMULATION=true" in result.message
    assert "NET_ADMIN" in result.message


@pytest.mark.parametrize(
    ("policy", "network", "refused"),
    [
        (p.AdmissionPolicy(), None, False),
        (p.AdmissionPolicy(), {"lossPercent": 1}, True),
        (p.AdmissionPolicy(allow_network_emulation=True), {"lossPercent": 1}, False),
        (h.PERMISSIVE, {"bandwidthMbit": 10}, True),  # allowing every image does not allow this
        (ALLOWED, NETWORK, False),
    ],
)
def test_policy_table(policy: p.AdmissionPolicy, network: dict[str, float] | None, refused: bool) -> None:
    assert bool(p.check_network(network, policy)) == refused
    spec = {"network": network} if network is not None else {}
    assert isinstance(admit(policy, **spec), admission.Rejection) == refused


def test_network_refusal_is_listed_with_the_others() -> None:
    result = admit(p.AdmissionPolicy(), network={"latencyMs": 5}, image="evil.example.com/x:1")
    assert isinstance(result, admission.Rejection)
    assert "spec.image" in result.message
    assert "spec.network" in result.message


@pytest.mark.parametrize(("raw", "allowed"), [("", False), ("false", False), ("true", True), (" TRUE ", True)])
def test_setting_from_env(raw: str, allowed: bool) -> None:
    assert p.AdmissionPolicy.from_env({"MLBENCH_ALLOW_NETWORK_EMULATION": raw}).allow_network_emulation is allowed
    assert OperatorConfig.from_env({"MLBENCH_ALLOW_NETWORK_EMULATION": raw}).policy.allow_network_emulation is allowed
    assert p.AdmissionPolicy.from_env({}).allow_network_emulation is False


def test_bad_setting_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="MLBENCH_ALLOW_NETWORK_EMULATION='yes' must be true or false"):
        OperatorConfig.from_env({"MLBENCH_ALLOW_NETWORK_EMULATION": "yes"})


# -- the worker pod -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("network", "run_as_user"),
    [(None, 1000), (NETWORK, 1000), ({"latencyMs": 20}, None)],
    ids=["none", "all-fields", "image-user"],
)
def test_worker_has_the_init_container_exactly_when_network_is_set(
    network: dict[str, float] | None, run_as_user: int | None
) -> None:
    spec = {"network": network} if network is not None else {}
    ctx = dataclasses.replace(ctx_for(**spec), run_as_user=run_as_user)
    worker = runpods.worker_pod(ctx, 1, 0)["spec"]
    launcher = runpods.launcher_pod(ctx, 0)["spec"]
    assert [c["name"] for c in launcher["initContainers"]] == ["wait-for-workers"]  # the launcher: nothing new
    if network is None:
        assert "initContainers" not in worker
        assert runpods.netem_init_container(ctx) is None
        return
    (init,) = worker["initContainers"]
    assert init["name"] == runpods.NETEM_CONTAINER
    assert init["image"] == worker["containers"][0]["image"] == ctx.image
    assert init["command"] == ["mlbench-runner", "netem", "--interface", "eth0", "--config", "/etc/mlbench/config.json"]
    assert init["volumeMounts"] == [{"name": "config", "mountPath": contract.CONFIG_DIR, "readOnly": True}]
    assert "config" in {v["name"] for v in worker["volumes"]}
    assert init["securityContext"] == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
    }
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # the main container stays as it was: non-root, no capability
    assert worker["containers"][0]["securityContext"] == runpods.container_security(ctx)


def test_init_container_has_the_workers_cpu_and_memory_not_its_gpus() -> None:
    ctx = ctx_for(network={"latencyMs": 5}, backend="nccl", resources={"cpu": "4", "memory": "8Gi", "gpu": 2})
    init = runpods.worker_pod(ctx, 0, 0)["spec"]["initContainers"][0]
    quantities = {"cpu": "4", "memory": "8Gi"}  # init containers count towards the pod's QoS class
    assert init["resources"] == {"requests": quantities, "limits": quantities}
    bare = runpods.worker_pod(ctx_for(network={"latencyMs": 5}), 0, 0)["spec"]["initContainers"][0]
    assert bare["resources"] == {}
    gpu_only = ctx_for(network={"latencyMs": 5}, backend="nccl", resources={"gpu": 1})
    assert runpods.worker_pod(gpu_only, 0, 0)["spec"]["initContainers"][0]["resources"] == {}


def test_the_network_worker_leaves_the_restricted_profile_only_through_the_init_container() -> None:
    ctx = ctx_for(network={"latencyMs": 5})
    problems = restricted_violations(runpods.worker_pod(ctx, 0, 0)["spec"])
    where = f"initContainers[{runpods.NETEM_CONTAINER}]"
    assert problems == [
        f"{where}: capabilities.add ['NET_ADMIN']",
        f"{where}: runAsNonRoot must be true",
        f"{where}: runAsUser=0",
    ]
    assert restricted_violations(runpods.launcher_pod(ctx, 0)["spec"]) == []
    assert restricted_violations(runpods.worker_pod(ctx_for(), 0, 0)["spec"]) == []


def test_the_init_container_applies_what_the_config_map_carries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Operator to runner: the ConfigMap's config.json, read by the init container's own command."""
    from mlbench_runner.cli import main

    ctx = ctx_for(network=NETWORK)
    data = runobjects.config_map(ctx)["data"][contract.CONFIG_FILE]
    assert json.loads(data)["network"] == NETWORK
    path = tmp_path / contract.CONFIG_FILE
    path.write_text(data)
    command = runpods.netem_init_container(ctx)["command"]  # type: ignore[index]
    argv = [*command[1:], "--dry-run"]
    argv[argv.index("--config") + 1] = str(path)
    assert main(argv) == 0
    assert capsys.readouterr().out == (
        "tc qdisc replace dev eth0 root handle 1: htb default 1\n"
        "tc class replace dev eth0 parent 1: classid 1:1 htb rate 100mbit ceil 100mbit burst 12500 cburst 12500 "
        "quantum 65536\n"
        "tc qdisc replace dev eth0 parent 1:1 handle 10: netem limit 1000 delay 5ms 1ms loss random 0.1%\n"
    )


@pytest.mark.parametrize(
    ("network", "timeout"),
    [(None, None), ({"bandwidthMbit": 10}, None), ({"latencyMs": 20}, 2), ({"latencyMs": 2500, "jitterMs": 600}, 5)],
)
def test_readiness_probe_waits_for_the_delayed_answer(network: dict[str, float] | None, timeout: int | None) -> None:
    """The probe's SYN-ACK leaves through netem: the default 1 s timeout would never see a slow worker Ready."""
    spec = {"network": network} if network is not None else {}
    probe = runpods.worker_pod(ctx_for(**spec), 0, 0)["spec"]["containers"][0]["readinessProbe"]
    assert probe.get("timeoutSeconds") == timeout
    assert probe["tcpSocket"] == {"port": "ssh"}


@pytest.mark.parametrize(
    ("network", "grace"),
    [(None, 30), ({"bandwidthMbit": 100}, 30), ({"latencyMs": 5}, 31), ({"latencyMs": 5000, "jitterMs": 1000}, 78)],
)
def test_sshd_waits_for_a_handshake_the_emulated_delay_slows(network: dict[str, float] | None, grace: int) -> None:
    """An ssh handshake is about 4 round trips: with seconds of latency it outlasts sshd's 30 s LoginGraceTime
    (and the launcher's 10 s ConnectTimeout, which grows the same way: tests/runner/test_collect.py)."""
    spec = {} if network is None else {"network": network}
    script = runpods.worker_pod(ctx_for(**spec), 0, 0)["spec"]["containers"][0]["command"][2]
    assert f"-o LoginGraceTime={grace} " in script
    if network is None:
        assert script == runpods.WORKER_SCRIPT
