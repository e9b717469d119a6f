"""spec.network as tc netem: the command lines (table), ``mlbench-runner netem``, and real network namespaces.

The namespace tests need root and ``ip netns`` (skipped with the reason otherwise). Where the kernel
has no netem qdisc (CONFIG_NET_SCH_NETEM), the tests that need the qdisc are skipped, and what still
runs is what tc itself can check: every command line parses (tc reports "qdisc kind is unknown" only
after its own parser accepted the options) and the CLI's failures are named. With netem, two gloo
ranks in two namespaces over a veth pair shaped by ``mlbench-runner netem`` (the worker pods' init
container command) must be slower than the configured delay allows: a lower bound from physics
(tests/runner/netlab.py), not a speed claim.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlbench_api.run import NetworkConditions
from mlbench_runner import netem
from mlbench_runner.cli import main

from . import netlab
from .helpers import logreg_task, make_config

# -- the command lines ----------------------------------------------------------------------------------------------
TABLE: list[tuple[dict[str, float], list[str]]] = [
    ({"latencyMs": 20}, ["limit", "333334", "delay", "20ms"]),
    ({"latencyMs": 0.5}, ["limit", "8334", "delay", "500us"]),
    ({"latencyMs": 20, "jitterMs": 2}, ["limit", "366667", "delay", "20ms", "2ms"]),
    ({"latencyMs": 20, "jitterMs": 0}, ["limit", "333334", "delay", "20ms"]),
    ({"lossPercent": 0.1}, ["limit", "1000", "loss", "random", "0.1%"]),
    ({"lossPercent": 0.000001}, ["limit", "1000", "loss", "random", "0.000001%"]),
    ({"bandwidthMbit": 100}, ["limit", "1000", "rate", "100mbit"]),
    ({"bandwidthMbit": 1.5}, ["limit", "1000", "rate", "1500kbit"]),
    ({"bandwidthMbit": 25000}, ["limit", "1000", "rate", "25gbit"]),
    ({"bandwidthMbit": 0.0123456}, ["limit", "1000", "rate", "12346bit"]),
    ({"bandwidthMbit": 0.000001}, ["limit", "1000", "rate", "8bit"]),
    (
        {"bandwidthMbit": 1000, "latencyMs": 50, "jitterMs": 5, "lossPercent": 1},
        ["limit", "9167", "delay", "50ms", "5ms", "loss", "random", "1%", "rate", "1gbit"],
    ),
    ({"latencyMs": 10_000}, ["limit", str(netem.MAX_LIMIT), "delay", "10000ms"]),
    ({"bandwidthMbit": 10, "latencyMs": 2}, ["limit", "1000", "delay", "2ms", "rate", "10mbit"]),
]


@pytest.mark.parametrize(("network", "options"), TABLE)
def test_netem_command_lines(network: dict[str, float], options: list[str]) -> None:
    conditions = NetworkConditions.model_validate(network)
    assert netem.netem_commands(conditions, "eth0") == [
        ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", *options]
    ]


def test_queue_limit_holds_the_packets_in_flight() -> None:
    # A latency-only link would otherwise be capped at 1000 packets per delay (netem's default queue).
    fast = NetworkConditions(latency_ms=50)
    assert netem.queue_limit(fast) * netem.MTU_BYTES / 0.05 * 8 >= 2 * netem.ASSUMED_LINE_RATE_MBIT * 1e6
    slow = NetworkConditions(latency_ms=50, bandwidth_mbit=10)
    assert netem.queue_limit(slow) == netem.DEFAULT_LIMIT  # 10 Mbit x 50 ms is 42 packets
    assert netem.queue_limit(NetworkConditions(latency_ms=10_000)) == netem.MAX_LIMIT


def test_show_and_clear() -> None:
    assert netem.show_command("eth1") == ["tc", "qdisc", "show", "dev", "eth1"]
    assert netem.clear_command("eth1") == ["tc", "qdisc", "del", "dev", "eth1", "root"]


@pytest.mark.parametrize(
    ("stderr", "needle"),
    [
        ("RTNETLINK answers: Operation not permitted\n", "CAP_NET_ADMIN"),
        ("Error: Specified qdisc kind is unknown.\n", "sch_netem"),
        ('Cannot find device "eth9"\n', "no interface 'eth9'"),
        ("Something else\n", "Something else"),
    ],
)
def test_failures_are_explained(stderr: str, needle: str) -> None:
    message = netem.explain(["tc", "qdisc", "replace", "dev", "eth9"], 2, stderr, "eth9")
    assert needle in message
    assert message.startswith("tc qdisc replace dev eth9 failed (exit 2)")


# -- mlbench-runner netem (no tc run) ---------------------------------------------------------------------------------
def _config(tmp_path: Path, network: dict[str, float] | None) -> Path:
    """A real RunConfig, formed from a run with ``spec.network`` as the operator forms it."""
    spec: dict[str, Any] = {"network": network} if network is not None else {}
    config = make_config(logreg_task(), tmp_path / "out", 2, **spec)
    assert (config.network is None) == (network is None)
    path = tmp_path / "config.json"
    path.write_text(config.dump())
    return path


def test_cli_reads_the_run_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, {"latencyMs": 5, "bandwidthMbit": 100})
    assert main(["netem", "--config", str(path), "--interface", "eth0", "--dry-run"]) == 0
    assert capsys.readouterr().out == "tc qdisc replace dev eth0 root netem limit 1000 delay 5ms rate 100mbit\n"


def test_cli_reads_the_config_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLBENCH_RUN_CONFIG", str(_config(tmp_path, {"lossPercent": 2})))
    assert main(["netem", "--dry-run"]) == 0
    assert capsys.readouterr().out == "tc qdisc replace dev eth0 root netem limit 1000 loss random 2%\n"


def test_cli_without_network_applies_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["netem", "--config", str(_config(tmp_path, None))]) == 0  # would fail if it ran tc on eth0
    assert "nothing applied" in capsys.readouterr().out


def test_cli_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["netem", "--latency-ms", "1.25", "--jitter-ms", "0.25", "--interface", "veth1", "--dry-run"]) == 0
    assert capsys.readouterr().out == "tc qdisc replace dev veth1 root netem limit 25000 delay 1250us 250us\n"
    assert main(["netem", "--clear", "--interface", "veth1", "--dry-run"]) == 0
    assert capsys.readouterr().out == "tc qdisc del dev veth1 root\n"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--jitter-ms", "2"], "set at least one of bandwidthMbit, latencyMs, lossPercent"),
        (["--latency-ms", "-1"], "latencyMs"),
        (["--loss-percent", "100"], "lossPercent"),
        (["--latency-ms", "5", "--config", "/c.json"], "not both"),
        ([], "pass --config, set MLBENCH_RUN_CONFIG"),
        (["--config", "/nonexistent/config.json"], "No such file"),
    ],
)
def test_cli_refuses_bad_input_with_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLBENCH_RUN_CONFIG", raising=False)
    assert main(["netem", "--dry-run", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_cli_reports_a_missing_tc(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["netem", "--latency-ms", "5"]) == 1
    assert "tc not found: the image needs iproute2" in capsys.readouterr().err


# -- real network namespaces ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def namespaces_or_skip() -> None:
    why = netlab.unavailable()
    if why:
        pytest.skip(f"network namespaces: {why}")


@pytest.fixture(scope="module")
def netem_or_skip(namespaces_or_skip: None) -> None:
    why = netlab.netem_unavailable()
    if why:
        pytest.skip(why)


@pytest.fixture
def pair(namespaces_or_skip: None) -> Iterator[tuple[netlab.Side, netlab.Side]]:
    with netlab.veth_pair() as sides:  # deleted on the way out, whatever the test did
        yield sides


@pytest.mark.parametrize(("network", "options"), TABLE)
def test_tc_accepts_every_command_line(
    pair: tuple[netlab.Side, netlab.Side], network: dict[str, float], options: list[str]
) -> None:
    """tc parses the options before it asks the kernel: a kernel without netem answers after the parse."""
    side = pair[0]
    for command in netem.netem_commands(NetworkConditions.model_validate(network), side.interface):
        done = netlab.sh(netlab.in_ns(side.ns, command), check=False)
        assert done.returncode == 0 or "qdisc kind is unknown" in done.stderr, done.stderr


def test_cli_without_net_admin_names_the_capability(pair: tuple[netlab.Side, netlab.Side]) -> None:
    side = pair[0]
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]  # root, but without any capability
    argv = netlab.in_ns(side.ns, [*drop, sys.executable, "-m", "mlbench_runner.cli", "netem"])
    argv += ["--interface", side.interface, "--latency-ms", "5"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=netlab.python_env(), timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Operation not permitted" in done.stderr
    assert "CAP_NET_ADMIN" in done.stderr


def test_cli_names_a_kernel_without_netem(pair: tuple[netlab.Side, netlab.Side]) -> None:
    if netlab.netem_unavailable() is None:
        pytest.skip("this kernel has netem (the failure this test checks cannot happen here)")
    side = pair[0]
    done = netlab.runner_cli(side, ["netem", "--interface", side.interface, "--latency-ms", "5"])
    assert done.returncode == 1
    assert "the node's kernel has no netem qdisc" in done.stderr


def test_cli_applies_the_run_config_in_a_namespace(
    netem_or_skip: None, pair: tuple[netlab.Side, netlab.Side], tmp_path: Path
) -> None:
    side = pair[0]
    config = _config(tmp_path, {"bandwidthMbit": 100, "latencyMs": 20, "jitterMs": 2, "lossPercent": 0.5})
    done = netlab.runner_cli(side, ["netem", "--interface", side.interface, "--config", str(config)])
    assert done.returncode == 0, done.stderr
    assert f"applied: tc qdisc replace dev {side.interface} root netem" in done.stdout
    shown = netlab.sh(netlab.in_ns(side.ns, netem.show_command(side.interface))).stdout
    for pattern in (r"qdisc netem \S+ root", r"delay 20(\.0+)?ms\s+2(\.0+)?ms", r"loss 0\.5%", r"rate 100Mbit"):
        assert re.search(pattern, shown), (pattern, shown)
    assert main(["netem", "--clear", "--interface", side.interface, "--dry-run"]) == 0
    cleared = netlab.runner_cli(side, ["netem", "--clear", "--interface", side.interface])
    assert cleared.returncode == 0, cleared.stderr
    assert "netem" not in netlab.sh(netlab.in_ns(side.ns, netem.show_command(side.interface))).stdout


#: One-way delay each side adds (ms), and the timed calls (even: the bound counts calls in pairs).
LATENCY_MS = 25
CALLS = 20


def test_allreduce_over_a_shaped_link_pays_the_delay(
    netem_or_skip: None, pair: tuple[netlab.Side, netlab.Side]
) -> None:
    a, b = pair
    for side in (a, b):
        done = netlab.runner_cli(side, ["netem", "--interface", side.interface, "--latency-ms", str(LATENCY_MS)])
        assert done.returncode == 0, done.stderr
        assert re.search(rf"qdisc netem .*delay {LATENCY_MS}(\.0+)?ms", done.stdout), done.stdout
    timing = netlab.allreduce(a, b, [4096], CALLS)[4096]
    # Each pair of calls spans a delay in each direction (netlab's docstring): physics, whatever gloo does.
    bound = CALLS / 2 * 2 * LATENCY_MS / 1000
    assert timing.total >= bound, (timing.total, bound, timing.calls)
    assert len(timing.calls) == CALLS
