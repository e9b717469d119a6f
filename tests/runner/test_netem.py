"""spec.network as tc htb + tc netem: the command lines (table), ``mlbench-runner netem``, real network namespaces.

The namespace tests need root and ``ip netns`` (skipped with the reason otherwise), and each qdisc kind
they apply (htb for the bandwidth, netem for delay and loss: skipped with the kernel's reason where it
lacks one; this project's development VM has htb but no netem). Whatever the kernel has, they check that
it (or tc's own parser, which accepts the options before it asks the kernel for the qdisc) takes every
command line, and that the CLI's failures are named. Two gloo ranks in two namespaces over a veth pair
shaped by ``mlbench-runner netem`` (the worker pods' init container command) must be slower than the
configured rate, or delay, allows: lower bounds from physics (tests/runner/netlab.py), not speed claims.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlbench_api.network import NetworkConditions
from mlbench_runner.cli import main
from mlbench_runner.pod import netem

from . import netlab
from .helpers import logreg_task, make_config

# -- the command lines ----------------------------------------------------------------------------------------------
ROOT_NETEM = "tc qdisc replace dev eth0 root netem"
HTB_ROOT = "tc qdisc replace dev eth0 root handle 1: htb default 1"
HTB_CLASS = "tc class replace dev eth0 parent 1: classid 1:1 htb"
LEAF_NETEM = "tc qdisc replace dev eth0 parent 1:1 handle 10: netem"


def htb(rate: str, burst: int) -> list[str]:
    return [HTB_ROOT, f"{HTB_CLASS} rate {rate} ceil {rate} burst {burst} cburst {burst} quantum 65536"]


TABLE: list[tuple[dict[str, float], list[str]]] = [
    # latency, jitter, loss only: netem as the root qdisc
    ({"latencyMs": 20}, [f"{ROOT_NETEM} limit 333334 delay 20ms"]),
    ({"latencyMs": 0.5}, [f"{ROOT_NETEM} limit 8334 delay 500us"]),
    ({"latencyMs": 20, "jitterMs": 2}, [f"{ROOT_NETEM} limit 366667 delay 20ms 2ms"]),
    ({"latencyMs": 20, "jitterMs": 0}, [f"{ROOT_NETEM} limit 333334 delay 20ms"]),
    ({"lossPercent": 0.1}, [f"{ROOT_NETEM} limit 1000 loss random 0.1%"]),
    ({"lossPercent": 0.000001}, [f"{ROOT_NETEM} limit 1000 loss random 0.000001%"]),
    ({"latencyMs": 10_000}, [f"{ROOT_NETEM} limit {netem.MAX_LIMIT} delay 10000ms"]),
    # bandwidth only: HTB, no netem; burst 1 ms at the rate, at least 1600 bytes, at most 60 s at the rate
    ({"bandwidthMbit": 100}, htb("100mbit", 12500)),
    ({"bandwidthMbit": 1.5}, htb("1500kbit", 1600)),
    ({"bandwidthMbit": 25000}, htb("25gbit", 3_125_000)),
    ({"bandwidthMbit": 400_000}, htb("400gbit", 50_000_000)),
    ({"bandwidthMbit": 12.8}, htb("12800kbit", 1600)),
    ({"bandwidthMbit": 12.9}, htb("12900kbit", 1613)),
    ({"bandwidthMbit": 0.0123456}, htb("12346bit", 1600)),
    ({"bandwidthMbit": 0.0002}, htb("200bit", 1500)),
    ({"bandwidthMbit": 0.000001}, htb("8bit", 60)),
    # both: HTB root and class, netem (without a rate) as the class's leaf
    (
        {"bandwidthMbit": 1000, "latencyMs": 50, "jitterMs": 5, "lossPercent": 1},
        [*htb("1gbit", 125_000), f"{LEAF_NETEM} limit 9167 delay 50ms 5ms loss random 1%"],
    ),
    ({"bandwidthMbit": 10, "latencyMs": 2}, [*htb("10mbit", 1600), f"{LEAF_NETEM} limit 1000 delay 2ms"]),
    ({"bandwidthMbit": 10, "lossPercent": 0}, [*htb("10mbit", 1600), f"{LEAF_NETEM} limit 1000"]),
]


@pytest.mark.parametrize(("network", "commands"), TABLE)
def test_tc_command_lines(network: dict[str, float], commands: list[str]) -> None:
    conditions = NetworkConditions.model_validate(network)
    assert [shlex.join(c) for c in netem.netem_commands(conditions, "eth0")] == commands
    kinds = netem.qdiscs(conditions)
    assert kinds == [kind for kind in ("htb", "netem") if any(f" {kind}" in c for c in commands)]
    assert all(kind in netem.describe(conditions, "eth0") for kind in kinds)


def test_burst_holds_a_millisecond_at_the_rate_within_bounds() -> None:
    for mbit in (0.000001, 0.01, 1, 12.8, 100, 1000, 400_000):
        rate_bytes = netem.rate_bits(mbit) / 8
        burst = netem.burst_bytes(mbit)
        assert burst >= min(netem.MIN_BURST_BYTES, rate_bytes * netem.MAX_BURST_SECONDS) - 1
        assert burst >= min(rate_bytes * netem.BURST_SECONDS, rate_bytes * netem.MAX_BURST_SECONDS) - 1
        assert burst / rate_bytes <= netem.MAX_BURST_SECONDS  # tc keeps it in 32-bit ticks (~274 s)


def test_queue_limit_holds_the_packets_in_flight() -> None:
    # A latency-only link would otherwise be capped at 1000 packets per delay (netem's default queue).
    fast = NetworkConditions(latency_ms=50)
    assert netem.queue_limit(fast) * netem.MTU_BYTES / 0.05 * 8 >= 2 * netem.ASSUMED_LINE_RATE_MBIT * 1e6
    slow = NetworkConditions(latency_ms=50, bandwidth_mbit=10)
    assert netem.queue_limit(slow) == netem.DEFAULT_LIMIT  # 10 Mbit x 50 ms is 42 packets
    assert netem.queue_limit(NetworkConditions(latency_ms=10_000)) == netem.MAX_LIMIT


def test_show_and_clear() -> None:
    assert netem.show_commands("eth1") == [
        ["tc", "qdisc", "show", "dev", "eth1"],
        ["tc", "class", "show", "dev", "eth1"],
    ]
    assert netem.clear_command("eth1") == ["tc", "qdisc", "del", "dev", "eth1", "root"]


NETEM_CMD = ["tc", "qdisc", "replace", "dev", "eth9", "root", "netem", "delay", "5ms"]
HTB_CMD = ["tc", "qdisc", "replace", "dev", "eth9", "root", "handle", "1:", "htb", "default", "1"]


@pytest.mark.parametrize(
    ("command", "stderr", "needle"),
    [
        (NETEM_CMD, "RTNETLINK answers: Operation not permitted\n", "CAP_NET_ADMIN"),
        (HTB_CMD, "RTNETLINK answers: Operation not permitted\n", "CAP_NET_ADMIN"),
        (NETEM_CMD, "Error: Specified qdisc kind is unknown.\n", "the node's kernel has no netem qdisc"),
        (NETEM_CMD, "Error: Specified qdisc kind is unknown.\n", "sch_netem"),
        (NETEM_CMD, "Error: Specified qdisc kind is unknown.\n", "bandwidthMbit alone needs only htb"),
        (HTB_CMD, "Error: Specified qdisc kind is unknown.\n", "the node's kernel has no htb qdisc"),
        (HTB_CMD, "Error: Specified qdisc kind is unknown.\n", "CONFIG_NET_SCH_HTB, module sch_htb"),
        (NETEM_CMD, 'Cannot find device "eth9"\n', "no interface 'eth9'"),
        (HTB_CMD, "Something else\n", "Something else"),
    ],
)
def test_failures_are_explained(command: list[str], stderr: str, needle: str) -> None:
    message = netem.explain(command, 2, stderr, "eth9")
    assert needle in message
    assert message.startswith(f"{shlex.join(command)} failed (exit 2)")


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
    assert capsys.readouterr().out == "\n".join([*htb("100mbit", 12500), f"{LEAF_NETEM} limit 1000 delay 5ms", ""])


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


class FakeTc:
    """subprocess.run for tc: records the argv, answers like a kernel without netem (or with nothing to clear)."""

    def __init__(self, root: str | None) -> None:
        self.root = root  # the root qdisc's kind; None: the interface's default qdisc
        self.ran: list[str] = []

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.ran.append(shlex.join(argv))
        out, err, rc = "", "", 0
        if argv[1:3] == ["qdisc", "del"]:
            if self.root is None:
                err, rc = "Error: Cannot delete qdisc with handle of zero.\n", 2
            self.root = None
        elif "netem" in argv:
            err, rc = "Error: Specified qdisc kind is unknown.\n", 2
        elif argv[1:3] == ["qdisc", "replace"] and "root" in argv:
            self.root = "htb"
        elif argv[1:3] == ["qdisc", "show"]:
            out = f"qdisc {self.root or 'noqueue'} 1: root\n"
        elif argv[1:3] == ["class", "show"] and self.root == "htb":
            out = "class htb 1:1 root rate 100Mbit\n"
        return subprocess.CompletedProcess(argv, rc, out, err)


def test_apply_clears_first_and_leaves_nothing_half_shaped(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTc(root="netem")  # conditions applied before: removed, so other conditions can follow
    monkeypatch.setattr(subprocess, "run", fake)
    bandwidth = NetworkConditions(bandwidth_mbit=100)
    assert netem.apply(bandwidth, "eth0") == "qdisc htb 1: root\nclass htb 1:1 root rate 100Mbit\n"
    shows = ["tc qdisc show dev eth0", "tc class show dev eth0"]
    assert fake.ran == ["tc qdisc del dev eth0 root", *htb("100mbit", 12500), *shows]
    fake.ran.clear()
    with pytest.raises(netem.NetemError, match="no netem qdisc"):
        netem.apply(NetworkConditions(bandwidth_mbit=100, latency_ms=5), "eth0")
    # HTB went on, netem failed: HTB is removed again, so the worker never runs on half the conditions
    assert fake.ran[0] == "tc qdisc del dev eth0 root"
    assert fake.ran[1:3] == htb("100mbit", 12500)
    assert fake.ran[3].startswith(LEAF_NETEM)
    assert fake.ran[4:] == ["tc qdisc del dev eth0 root"]
    assert fake.root is None


def test_cli_clear_is_idempotent(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(subprocess, "run", FakeTc(root="htb"))
    assert main(["netem", "--clear", "--interface", "eth0"]) == 0
    assert capsys.readouterr().out == "cleared eth0\n"
    assert main(["netem", "--clear", "--interface", "eth0"]) == 0
    assert "nothing to clear" in capsys.readouterr().out


@pytest.mark.multiproc
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
    why = netlab.qdisc_unavailable("netem")
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def htb_or_skip(namespaces_or_skip: None) -> None:
    why = netlab.qdisc_unavailable("htb")
    if why:
        pytest.skip(why)


@pytest.fixture
def pair(namespaces_or_skip: None) -> Iterator[tuple[netlab.Side, netlab.Side]]:
    with netlab.veth_pair() as sides:  # deleted on the way out, whatever the test did
        yield sides


def _shown(side: netlab.Side) -> str:
    return "".join(netlab.sh(netlab.in_ns(side.ns, c)).stdout for c in netem.show_commands(side.interface))


@pytest.mark.multiproc
@pytest.mark.parametrize(("network", "commands"), TABLE)
def test_tc_accepts_every_command_line(
    pair: tuple[netlab.Side, netlab.Side], network: dict[str, float], commands: list[str]
) -> None:
    """The kernel takes every command line (without a warning), in order; where it has no netem, tc has
    parsed netem's options before it asks the kernel, so "qdisc kind is unknown" still means they parse."""
    side = pair[0]
    no_netem = netlab.qdisc_unavailable("netem") is not None
    for command in netem.netem_commands(NetworkConditions.model_validate(network), side.interface):
        done = netlab.sh(netlab.in_ns(side.ns, command), check=False)
        if no_netem and "netem" in command:
            assert "qdisc kind is unknown" in done.stderr, done.stderr
        else:
            assert done.returncode == 0, (command, done.stderr)
            assert not done.stderr.strip(), (command, done.stderr)  # e.g. HTB's "quantum of class ... is big"
    if "bandwidthMbit" in network:
        assert re.search(r"class htb 1:1 root .*rate \S+ ceil \S+", _shown(side))


@pytest.mark.multiproc
@pytest.mark.parametrize("flags", [["--latency-ms", "5"], ["--bandwidth-mbit", "100"]])
def test_cli_without_net_admin_names_the_capability(pair: tuple[netlab.Side, netlab.Side], flags: list[str]) -> None:
    side = pair[0]
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]  # root, but without any capability
    argv = netlab.in_ns(side.ns, [*drop, sys.executable, "-m", "mlbench_runner.cli", "netem"])
    argv += ["--interface", side.interface, *flags]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=netlab.python_env(), timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Operation not permitted" in done.stderr
    assert "CAP_NET_ADMIN" in done.stderr


@pytest.mark.multiproc
@pytest.mark.parametrize("flags", [["--latency-ms", "5"], ["--bandwidth-mbit", "100", "--loss-percent", "1"]])
def test_cli_names_a_kernel_without_netem(pair: tuple[netlab.Side, netlab.Side], flags: list[str]) -> None:
    if netlab.qdisc_unavailable("netem") is None:
        pytest.skip("this kernel has netem (the failure this test checks cannot happen here)")
    side = pair[0]
    done = netlab.runner_cli(side, ["netem", "--interface", side.interface, *flags])
    assert done.returncode == 1
    assert "the node's kernel has no netem qdisc" in done.stderr
    assert "htb" not in _shown(side)  # HTB went on before netem failed: removed again, nothing half shaped


@pytest.mark.multiproc
def test_cli_applies_bandwidth_with_htb(
    htb_or_skip: None, pair: tuple[netlab.Side, netlab.Side], tmp_path: Path
) -> None:
    side = pair[0]
    config = _config(tmp_path, {"bandwidthMbit": 100})
    done = netlab.runner_cli(side, ["netem", "--interface", side.interface, "--config", str(config)])
    assert done.returncode == 0, done.stderr
    assert not done.stderr.strip(), done.stderr  # no warning from tc
    assert f"applied: tc qdisc replace dev {side.interface} root handle 1: htb default 1" in done.stdout
    assert f"qdiscs: {side.interface} egress: htb 1: (rate 100mbit, burst 12500 bytes)" in done.stdout
    shown = _shown(side)
    for pattern in (
        r"qdisc htb 1: root .*default 0?x?1\b",
        r"class htb 1:1 root .*rate 100Mbit ceil 100Mbit burst 12500b",
    ):
        assert re.search(pattern, shown), (pattern, shown)
        assert re.search(pattern, done.stdout), (pattern, done.stdout)  # the CLI prints what the kernel holds
    assert "netem" not in shown
    # Applying again, with other conditions, replaces what was there (the init container may run twice).
    again = netlab.runner_cli(side, ["netem", "--interface", side.interface, "--bandwidth-mbit", "250"])
    assert again.returncode == 0, again.stderr
    assert re.search(r"class htb 1:1 root .*rate 250Mbit ceil 250Mbit burst 31250b", _shown(side)), _shown(side)
    cleared = netlab.runner_cli(side, ["netem", "--clear", "--interface", side.interface])
    assert cleared.returncode == 0, cleared.stderr
    assert "htb" not in _shown(side)
    twice = netlab.runner_cli(side, ["netem", "--clear", "--interface", side.interface])
    assert twice.returncode == 0, twice.stderr
    assert "nothing to clear" in twice.stdout


@pytest.mark.multiproc
def test_cli_applies_the_run_config_in_a_namespace(
    netem_or_skip: None, htb_or_skip: None, pair: tuple[netlab.Side, netlab.Side], tmp_path: Path
) -> None:
    side = pair[0]
    config = _config(tmp_path, {"bandwidthMbit": 100, "latencyMs": 20, "jitterMs": 2, "lossPercent": 0.5})
    done = netlab.runner_cli(side, ["netem", "--interface", side.interface, "--config", str(config)])
    assert done.returncode == 0, done.stderr
    assert f"applied: tc qdisc replace dev {side.interface} parent 1:1 handle 10: netem" in done.stdout
    assert "-> netem 10:" in done.stdout
    shown = _shown(side)
    for pattern in (
        r"qdisc htb 1: root",
        r"qdisc netem 10: parent 1:1 .*delay 20(\.0+)?ms\s+2(\.0+)?ms",
        r"loss 0\.5%",
        r"class htb 1:1 root leaf 10: .*rate 100Mbit",
    ):
        assert re.search(pattern, shown), (pattern, shown)
    cleared = netlab.runner_cli(side, ["netem", "--clear", "--interface", side.interface])
    assert cleared.returncode == 0, cleared.stderr
    shown = _shown(side)
    assert "netem" not in shown
    assert "htb" not in shown


#: The shaped rate (Mbit/s), the all-reduce's message (bytes) and the timed calls.
RATE_MBIT = 100
MESSAGE = 4 << 20
RATE_CALLS = 4


@pytest.mark.multiproc
def test_allreduce_over_a_shaped_link_is_held_to_the_rate(
    htb_or_skip: None, pair: tuple[netlab.Side, netlab.Side]
) -> None:
    """A two-rank sum all-reduce cannot beat what must cross the link, whatever gloo does: rank 0's result
    and its own input give rank 1's whole input, so every call carries each rank's whole message (here
    4 MiB; gloo sends the raw floats) across each direction, each at ``bandwidthMbit`` (HTB on its sender).
    Unshaped, this veth carries the same calls about 30 times faster here (0.04 s against the 1.07 s
    bound; shaped 1.45 to 1.52 s), so the bound fails without the shaping. The 0.8 spares HTB's burst
    (12.5 kB per idle spell at 100 Mbit/s), nothing else."""
    a, b = pair
    for side in (a, b):
        done = netlab.runner_cli(side, ["netem", "--interface", side.interface, "--bandwidth-mbit", str(RATE_MBIT)])
        assert done.returncode == 0, done.stderr
        assert re.search(rf"class htb 1:1 root .*rate {RATE_MBIT}Mbit", done.stdout), done.stdout
    timing = netlab.allreduce(a, b, [MESSAGE], RATE_CALLS)[MESSAGE]
    at_rate = RATE_CALLS * MESSAGE * 8 / (RATE_MBIT * 1e6)  # payload only: headers make the link slower still
    assert timing.total >= 0.8 * at_rate, (timing.total, at_rate, timing.calls)
    assert len(timing.calls) == RATE_CALLS


#: One-way delay each side adds (ms), and the timed calls (even: the bound counts calls in pairs).
LATENCY_MS = 25
CALLS = 20


@pytest.mark.multiproc
def test_allreduce_over_a_delayed_link_pays_the_delay(
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
