"""All-reduce time over an emulated network: measured vs what the configured conditions predict.

Two network namespaces joined by one link; rank 0 of a two-rank gloo world in each (tests/runner/netlab.py);
per condition, the median time of a small (4 KiB) and a large (16 MiB) in-place sum all-reduce.
Every condition is applied to both sides' egress, as ``spec.network`` is on every worker pod.

Emulators (``--emulator``):

* ``tc`` (default): a veth pair, and ``mlbench-runner netem --interface ...`` run in each namespace,
  the very command the worker pods' init container runs: tc htb for ``bandwidthMbit``, tc netem for
  ``latencyMs``/``jitterMs``/``lossPercent``. A condition whose qdisc the kernel lacks (sch_netem is
  often missing; htb rarely) is listed as skipped, with the kernel's reason; the others are measured.
* ``tun``: for kernels without netem. Each namespace gets a TUN device instead, and a userspace
  forwarder (this script, ``forward``) carries the packets between them with the same model: a packet
  waits its serialization time at the rate behind the packets before it, then the delay; a lost packet
  is dropped. It shows the all-reduce under those conditions, not tc's implementation, and adds its own
  per-packet cost (the ``none`` row). Jumbo frames (``--mtu 9000``, the default) keep the Python
  forwarder ahead of the rates measured here; at 1500 it is the bottleneck of the large message.

Prediction (two ranks, gloo's ring all-reduce): a call has two phases (reduce-scatter, all-gather) in
which both ranks send at once, and gloo's tcp transport sends only after the receiver's "ready to
receive" notification arrived, so a call crosses the link ``ROUNDS`` = 4 times one after the other and
the delay adds ``4 x latency``. Each rank sends half the message per phase, the whole message per call,
which at the rate takes ``bytes x 8 / rate`` (times the IP/TCP/Ethernet header overhead at the MTU).
TCP's windows are not in the model: a large message over a long delay is where they show.

    sudo .venv/bin/python benchmarks/network_conditions.py                  # tc (htb, netem) on veth
    sudo .venv/bin/python benchmarks/network_conditions.py --emulator tun   # all conditions, without netem

Not a test: it prints figures. Needs root (ip netns).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import heapq
import json
import os
import random
import select
import signal
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for sub in ("crds", "runners", "."):
    if str(REPO / sub) not in sys.path:
        sys.path.insert(0, str(REPO / sub))

from mlbench_api.network import NetworkConditions  # noqa: E402
from mlbench_runner.pod import netem  # noqa: E402
from tests.runner import netlab  # noqa: E402

SMALL = 4 << 10
LARGE = 16 << 20
#: One-way link crossings on a call's critical path: gloo's ring over two ranks has two phases
#: (reduce-scatter, all-gather), and in each its tcp transport sends a segment only once the receiver's
#: "ready to receive" notification has arrived: notification, then data, per phase.
ROUNDS = 4
#: Bytes an Ethernet frame adds to an IP packet (htb and netem on veth count them; the tun forwarder adds them).
ETH_HEADER = 14
#: IPv4 + TCP headers with timestamps, per segment.
TCP_IP_HEADERS = 52


@dataclass(frozen=True)
class Condition:
    name: str
    network: NetworkConditions | None


CONDITIONS = [
    Condition("none", None),
    Condition("latency 1 ms", NetworkConditions(latency_ms=1)),
    Condition("latency 5 ms", NetworkConditions(latency_ms=5)),
    Condition("latency 20 ms", NetworkConditions(latency_ms=20)),
    Condition("bandwidth 100 Mbit", NetworkConditions(bandwidth_mbit=100)),
    Condition("bandwidth 250 Mbit", NetworkConditions(bandwidth_mbit=250)),
    Condition("bandwidth 1000 Mbit", NetworkConditions(bandwidth_mbit=1000)),
    Condition("bandwidth 2500 Mbit", NetworkConditions(bandwidth_mbit=2500)),
    Condition("100 Mbit + 5 ms", NetworkConditions(bandwidth_mbit=100, latency_ms=5)),
]


def link_seconds(network: NetworkConditions | None, size: int, mtu: int) -> float:
    """Seconds the rate needs for what each rank sends per call (the whole message, headers included)."""
    if network is None or network.bandwidth_mbit is None:
        return 0.0
    overhead = (mtu + ETH_HEADER) / (mtu - TCP_IP_HEADERS)
    return size * 8 * overhead / (network.bandwidth_mbit * 1e6)


def predicted(network: NetworkConditions | None, size: int, mtu: int, unshaped: float) -> float:
    """A call over the emulated link: the unshaped call (measured), or the transfer at the rate where that
    is slower, plus ROUNDS one-way delays (jitter averages out; loss is not modelled)."""
    if network is None:
        return unshaped
    return max(unshaped, link_seconds(network, size, mtu)) + ROUNDS * (network.latency_ms or 0.0) / 1000.0


# -- tc (htb, netem) on a veth pair --------------------------------------------------------------------------------
def netem_flags(network: NetworkConditions) -> list[str]:
    out = []
    for attr, flag in (
        ("bandwidth_mbit", "--bandwidth-mbit"),
        ("latency_ms", "--latency-ms"),
        ("jitter_ms", "--jitter-ms"),
        ("loss_percent", "--loss-percent"),
    ):
        value = getattr(network, attr)
        if value is not None:
            out += [flag, str(value)]
    return out


def tc_missing(network: NetworkConditions | None, missing: dict[str, str | None]) -> str | None:
    """Why this kernel cannot apply ``network`` with tc (None: it can); ``missing`` caches each kind's probe."""
    for kind in netem.qdiscs(network) if network is not None else []:
        if kind not in missing:
            missing[kind] = netlab.qdisc_unavailable(kind)
        if missing[kind]:
            return missing[kind]
    return None


@contextmanager
def tc_link(network: NetworkConditions | None) -> Iterator[tuple[netlab.Side, netlab.Side]]:
    with netlab.veth_pair() as (a, b):
        flags = netem_flags(network) if network is not None else []
        for side in (a, b) if flags else ():
            done = netlab.runner_cli(side, ["netem", "--interface", side.interface, *flags])
            if done.returncode != 0:
                raise RuntimeError(done.stderr.strip())
            used = next(line for line in done.stdout.splitlines() if line.startswith("qdiscs: "))
            print(f"  {side.ns}: {used}", flush=True)
        yield a, b


# -- the userspace (TUN) emulator -----------------------------------------------------------------------------------
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000


def _enter(ns_path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(ns_path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns_path}")
    finally:
        os.close(fd)


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def forward(namespaces: list[str], devices: list[str], conditions: list[dict[str, float] | None]) -> None:
    """Carry packets between the two TUN devices, each direction shaped by its sender's conditions."""
    fds = []
    for ns, dev in zip(namespaces, devices, strict=True):
        _enter(f"/run/netns/{ns}")
        fds.append(_open_tun(dev))
    shapes = [NetworkConditions.model_validate(c) if c else None for c in conditions]
    link_free = [0.0, 0.0]
    queue: list[tuple[float, int, int, bytes]] = []
    seq = 0
    rng = random.Random(1)
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, dst, packet = heapq.heappop(queue)
            with contextlib.suppress(OSError):  # the receiving side is gone or full: lost, as on a wire
                os.write(dst, packet)
        timeout = max(0.0, queue[0][0] - now) if queue else 1.0
        readable, _, _ = select.select(fds, [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            side = fds.index(fd)
            shape = shapes[side]
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                release = now
                if shape is not None:
                    if shape.loss_percent and rng.random() * 100 < shape.loss_percent:
                        continue
                    if shape.bandwidth_mbit:
                        start = max(now, link_free[side])
                        link_free[side] = start + (len(packet) + ETH_HEADER) * 8 / (shape.bandwidth_mbit * 1e6)
                        release = link_free[side]
                    delay = shape.latency_ms or 0.0
                    if shape.jitter_ms:
                        delay += rng.uniform(-shape.jitter_ms, shape.jitter_ms)
                    release += max(0.0, delay) / 1000.0
                heapq.heappush(queue, (release, seq, fds[1 - side], packet))
                seq += 1


@contextmanager
def tun_link(network: NetworkConditions | None, mtu: int) -> Iterator[tuple[netlab.Side, netlab.Side]]:
    with ExitStack() as stack:
        sides = []
        for tag, dev, addr in (("a", "mlbt0", "10.214.0.1"), ("b", "mlbt1", "10.214.0.2")):
            ns = stack.enter_context(netlab.namespace(tag))
            netlab.sh(["ip", "-n", ns, "tuntap", "add", "dev", dev, "mode", "tun"])
            # a long queue: packets wait there (not dropped) while the forwarder is busy
            netlab.sh(["ip", "-n", ns, "link", "set", dev, "mtu", str(mtu), "txqueuelen", "20000"])
            netlab.sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
            netlab.sh(["ip", "-n", ns, "link", "set", dev, "up"])
            sides.append(netlab.Side(ns, dev, addr))
        shape = network.model_dump(exclude_none=True) if network else None
        argv = [sys.executable, __file__, "forward", "--namespaces", sides[0].ns, sides[1].ns]
        argv += ["--devices", sides[0].interface, sides[1].interface, "--conditions", json.dumps([shape, shape])]

        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=netlab.python_env())
        stack.callback(proc.wait)
        stack.callback(proc.send_signal, signal.SIGTERM)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the TUN forwarder did not start")
        yield sides[0], sides[1]


# -- the measurement ------------------------------------------------------------------------------------------------
def calls_for(condition: Condition, size: int, budget_s: float) -> int:
    """Timed calls per size: enough for a median, about ``budget_s`` of predicted time at most."""
    if size <= SMALL:
        return 40
    per_call = predicted(condition.network, size, 1500, 0.05)
    return max(4, min(10, int(budget_s / per_call)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    fwd = sub.add_parser("forward", help="(internal) the TUN forwarder")
    fwd.add_argument("--namespaces", nargs=2, required=True)
    fwd.add_argument("--devices", nargs=2, required=True)
    fwd.add_argument("--conditions", required=True)
    parser.add_argument("--emulator", choices=("tc", "tun"), default="tc")
    parser.add_argument(
        "--mtu", type=int, default=9000, help="tun: the devices' MTU (default 9000: the forwarder keeps up; veth: 1500)"
    )
    parser.add_argument("--budget", type=float, default=8.0, help="seconds of large calls per condition")
    parser.add_argument("--only", nargs="*", help="measure only these conditions (by name; 'none' always runs)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if args.command == "forward":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        forward(args.namespaces, args.devices, json.loads(args.conditions))
        return
    why = netlab.unavailable()
    if why:
        sys.exit(f"cannot run with --emulator {args.emulator}: {why}")
    mtu = args.mtu if args.emulator == "tun" else 1500
    conditions = [c for c in CONDITIONS if not args.only or c.name == "none" or c.name in args.only]
    print(f"emulator: {args.emulator}, MTU {mtu}, two gloo ranks, conditions on both sides' egress", flush=True)
    measured: dict[tuple[str, int], float] = {}
    skipped: dict[str, str] = {}
    missing: dict[str, str | None] = {}
    for condition in conditions:
        print(f"- {condition.name}", flush=True)
        if args.emulator == "tc":
            reason = tc_missing(condition.network, missing)
            if reason:
                skipped[condition.name] = reason
                print(f"  skipped: {reason}", flush=True)
                continue
        link = tc_link(condition.network) if args.emulator == "tc" else tun_link(condition.network, mtu)
        with link as (a, b):
            counts = [calls_for(condition, size, args.budget) for size in (SMALL, LARGE)]
            timings = netlab.allreduce(a, b, [SMALL, LARGE], counts, timeout=600)
        for size, timing in timings.items():
            measured[(condition.name, size)] = statistics.median(timing.calls)
    rows = []
    header = f"{'condition':<20}{'size':>8}{'delays ms':>11}{'at rate ms':>12}{'predicted ms':>14}"
    header += f"{'measured ms':>13}{'measured/predicted':>20}{'Mbit/s':>9}"
    print("\n" + header + "\n" + "-" * len(header))
    for condition in conditions:
        network = condition.network
        for size in (SMALL, LARGE):
            label = "4 KiB" if size == SMALL else "16 MiB"
            delays = ROUNDS * (network.latency_ms or 0.0) / 1000.0 if network else 0.0
            at_rate = link_seconds(network, size, mtu)
            row: dict[str, object] = {
                "condition": condition.name,
                "network": network.model_dump(by_alias=True, exclude_none=True) if network else None,
                "bytes": size,
                "delaySeconds": delays,
                "linkSeconds": at_rate,
            }
            rows.append(row)
            if condition.name in skipped:
                row["skipped"] = skipped[condition.name]
                print(
                    f"{condition.name:<20}{label:>8}{delays * 1e3:>11.1f}{at_rate * 1e3:>12.1f}   skipped (see above)"
                )
                continue
            value = measured[(condition.name, size)]
            expect = predicted(network, size, mtu, measured[("none", size)])
            goodput = f"{size * 8 / value / 1e6:>9.0f}" if size == LARGE else f"{'':>9}"
            figures = f"{delays * 1e3:>11.1f}{at_rate * 1e3:>12.1f}{expect * 1e3:>14.1f}{value * 1e3:>13.1f}"
            print(f"{condition.name:<20}{label:>8}{figures}{value / expect:>20.2f}{goodput}")
            row.update(predictedSeconds=expect, measuredSeconds=value)
    print(
        f"\nmedian seconds per call on rank 0. delays: {ROUNDS} one-way crossings x latencyMs; at rate: the bytes "
        "each rank sends per call (the whole message, with IP/TCP/Ethernet headers) x 8 / bandwidthMbit; "
        "predicted: max(the 'none' row, at rate) + delays; Mbit/s: the message's bits / measured (payload only)"
    )
    for name, reason in skipped.items():
        hint = " (--emulator tun models it in userspace)" if args.emulator == "tc" else ""
        print(f"skipped {name}: {reason}{hint}")
    if args.json:
        args.json.write_text(json.dumps({"emulator": args.emulator, "mtu": mtu, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
