"""Emulated network conditions (``spec.network``) as Linux traffic control: one ``tc netem`` qdisc.

A worker pod's init container runs ``mlbench-runner netem --config /etc/mlbench/config.json`` (the
operator's builders), which replaces the root qdisc of the pod's interface with netem::

    tc qdisc replace dev eth0 root netem limit 1000 delay 20ms 2ms loss random 0.1% rate 100mbit

netem acts on what the interface *sends* (egress). Every worker shapes its own egress, so traffic
between two workers is delayed twice (a round trip gains ``2 x latencyMs``) and each direction is
limited to ``bandwidthMbit``. :func:`netem_commands` is pure (table-tested); :func:`apply` runs
the commands and explains a failure (no CAP_NET_ADMIN, a kernel without netem, a wrong interface).

Units (tc-netem(8)): ``delay TIME [JITTER]`` (jitter: uniform within +-JITTER; without a rate netem
may reorder packets then), ``loss random PERCENT``, ``rate RATE`` (bits per second; the packets
wait their serialization time, like on a real link), ``limit PACKETS`` (netem's queue, 1000 by
default). Every packet waiting out its delay sits in that queue, so a fixed 1000 would cap a
latency-only link at 1000 packets per ``latencyMs`` (about 240 Mbit/s at 50 ms): :func:`queue_limit`
sizes it from the rate (or :data:`ASSUMED_LINE_RATE_MBIT` without one) times the delay.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

from mlbench_api.config import CONFIG_ENV
from mlbench_api.errors import format_errors
from mlbench_api.run import NetworkConditions

#: The pod's interface (every common CNI names it eth0).
DEFAULT_INTERFACE = "eth0"
#: netem's own default queue length, in packets: the least :func:`queue_limit` gives.
DEFAULT_LIMIT = 1000
#: Bytes per packet assumed when sizing the queue (an Ethernet MTU; GSO packets are larger, so fewer).
MTU_BYTES = 1500
#: The interface speed assumed when no bandwidth is set (only to size the queue; nothing limits it).
ASSUMED_LINE_RATE_MBIT = 100_000
#: The queue never grows past this many packets (a sender filling it would hold that much memory).
MAX_LIMIT = 1_000_000


class NetemError(RuntimeError):
    """tc refused or failed; the message says why and what to change."""


def queue_limit(conditions: NetworkConditions) -> int:
    """netem's ``limit``: twice the packets a link at the rate has in flight during the longest delay."""
    delay_s = ((conditions.latency_ms or 0.0) + (conditions.jitter_ms or 0.0)) / 1000.0
    rate_bytes = (conditions.bandwidth_mbit or ASSUMED_LINE_RATE_MBIT) * 1e6 / 8
    packets = math.ceil(round(2 * rate_bytes * delay_s / MTU_BYTES, 6))  # no float noise above a whole number
    return min(MAX_LIMIT, max(DEFAULT_LIMIT, packets))


def format_time(ms: float) -> str:
    """A tc TIME: whole milliseconds as ``20ms``, anything finer in whole microseconds (``1500us``)."""
    if float(ms).is_integer():
        return f"{int(ms)}ms"
    return f"{round(ms * 1000)}us"


def format_rate(mbit: float) -> str:
    """A tc RATE in bits per second, in the largest exact unit (``100mbit``, ``1500kbit``, ``12345bit``)."""
    bits = max(8, round(mbit * 1e6))  # tc stores bytes per second: below 8 bit/s would mean 0 (no limit)
    for unit, size in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % size == 0:
            return f"{bits // size}{unit}"
    return f"{bits}bit"


def format_percent(value: float) -> str:
    """A tc PERCENT without an exponent (``0.001%``, ``1%``)."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return f"{text}%"


def netem_options(conditions: NetworkConditions) -> list[str]:
    """The netem options for ``conditions``: limit, then delay [jitter], loss and rate where set."""
    out = ["limit", str(queue_limit(conditions))]
    if conditions.latency_ms is not None:
        out += ["delay", format_time(conditions.latency_ms)]
        if conditions.jitter_ms:
            out.append(format_time(conditions.jitter_ms))
    if conditions.loss_percent:
        out += ["loss", "random", format_percent(conditions.loss_percent)]
    if conditions.bandwidth_mbit is not None:
        out += ["rate", format_rate(conditions.bandwidth_mbit)]
    return out


def netem_commands(conditions: NetworkConditions, interface: str = DEFAULT_INTERFACE) -> list[list[str]]:
    """The tc command lines (argv) that put ``conditions`` on ``interface``'s egress; idempotent (replace)."""
    return [["tc", "qdisc", "replace", "dev", interface, "root", "netem", *netem_options(conditions)]]


def show_command(interface: str = DEFAULT_INTERFACE) -> list[str]:
    return ["tc", "qdisc", "show", "dev", interface]


def clear_command(interface: str = DEFAULT_INTERFACE) -> list[str]:
    """Back to the interface's default qdisc."""
    return ["tc", "qdisc", "del", "dev", interface, "root"]


def explain(command: Sequence[str], returncode: int, stderr: str, interface: str) -> str:
    """One message for a failed tc: its own words plus what to change."""
    said = " ".join(stderr.split()) or "no message"
    text = f"{shlex.join(command)} failed (exit {returncode}): {said}"
    if "Operation not permitted" in stderr:
        return (
            f"{text}; tc needs CAP_NET_ADMIN in the pod's network namespace (the init container runs as root "
            "with capabilities.add [NET_ADMIN]; a namespace enforcing the baseline or restricted Pod Security "
            "profile, or a policy engine, may have removed it)"
        )
    if "qdisc kind is unknown" in stderr or "Unknown qdisc" in stderr:
        return (
            f"{text}; the node's kernel has no netem qdisc (CONFIG_NET_SCH_NETEM, module sch_netem: "
            "`modprobe sch_netem` on the node; on Ubuntu it ships in linux-modules-extra)"
        )
    if "Cannot find device" in stderr:
        return f"{text}; this network namespace has no interface {interface!r} (pass --interface)"
    return text


def run_tc(command: Sequence[str], interface: str) -> str:
    """Run one tc command; its stdout, or :class:`NetemError` with the reason."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        raise NetemError(f"{command[0]} not found: the image needs iproute2 (tc)") from None
    except subprocess.TimeoutExpired:
        raise NetemError(f"{shlex.join(command)} did not finish in 30 s") from None
    if done.returncode != 0:
        raise NetemError(explain(command, done.returncode, done.stderr or done.stdout, interface))
    return done.stdout


def apply(conditions: NetworkConditions, interface: str = DEFAULT_INTERFACE) -> str:
    """Put ``conditions`` on ``interface``; returns ``tc qdisc show`` afterwards (what the kernel holds)."""
    for command in netem_commands(conditions, interface):
        run_tc(command, interface)
    return run_tc(show_command(interface), interface)


# -- mlbench-runner netem ----------------------------------------------------------------------------------------
_FLAGS = (
    ("bandwidth_mbit", "bandwidthMbit"),
    ("latency_ms", "latencyMs"),
    ("jitter_ms", "jitterMs"),
    ("loss_percent", "lossPercent"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interface", default=DEFAULT_INTERFACE, help=f"the interface to shape (default {DEFAULT_INTERFACE})"
    )
    parser.add_argument("--config", help=f"RunConfig JSON/YAML whose network to apply (default ${CONFIG_ENV})")
    parser.add_argument("--bandwidth-mbit", type=float, help="instead of a config: egress rate in Mbit/s")
    parser.add_argument("--latency-ms", type=float, help="instead of a config: delay added to every packet sent")
    parser.add_argument("--jitter-ms", type=float, help="instead of a config: +- variation of the delay")
    parser.add_argument("--loss-percent", type=float, help="instead of a config: packets dropped at random, in %%")
    parser.add_argument("--dry-run", action="store_true", help="print the tc commands, run nothing")
    parser.add_argument("--clear", action="store_true", help="remove the emulation (the interface's default qdisc)")


def conditions_from_args(args: argparse.Namespace) -> NetworkConditions | None:
    """The flags' conditions, else the run config's ``network`` (None: the run declares none).

    Raises ValueError (a bad value, both flags and --config, no config at all) and OSError (unreadable file).
    """
    from mlbench_api.config import RunConfig

    given = {wire: getattr(args, attr) for attr, wire in _FLAGS if getattr(args, attr) is not None}
    if given:
        if args.config:
            raise ValueError("pass either --config or the condition flags, not both")
        return NetworkConditions.model_validate(given)
    path = args.config or os.environ.get(CONFIG_ENV)
    if not path:
        raise ValueError(f"pass --config, set {CONFIG_ENV}, or give the conditions as flags")
    return RunConfig.load(path).network


def run(args: argparse.Namespace) -> int:
    """0: applied (or nothing to apply); 1: tc failed; 2: bad input. Prints what the interface holds."""
    from pydantic import ValidationError

    if args.clear:
        command = clear_command(args.interface)
        if args.dry_run:
            print(shlex.join(command))
            return 0
        try:
            run_tc(command, args.interface)
        except NetemError as err:
            print(f"error: netem: {err}", file=sys.stderr)
            return 1
        print(f"cleared {args.interface}")
        return 0
    try:
        conditions = conditions_from_args(args)
    except ValidationError as err:
        print(f"error: netem: {'; '.join(format_errors(err))}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as err:
        print(f"error: netem: {err}", file=sys.stderr)
        return 2
    if conditions is None:
        print("netem: the run declares no network conditions (spec.network unset): nothing applied")
        return 0
    if args.dry_run:
        for command in netem_commands(conditions, args.interface):
            print(shlex.join(command))
        return 0
    try:
        shown = apply(conditions, args.interface)
    except NetemError as err:
        print(f"error: netem: {err}", file=sys.stderr)
        return 1
    for command in netem_commands(conditions, args.interface):
        print(f"applied: {shlex.join(command)}")
    print(shown.rstrip())
    return 0
