"""Emulated network conditions (``spec.network``) as Linux traffic control: tc htb and tc netem.

A worker pod's init container runs ``mlbench-runner netem --config /etc/mlbench/config.json`` (the
operator's builders), which replaces the root qdisc of the pod's interface. Each condition goes to the
qdisc made for it:

* ``bandwidthMbit``: an HTB (hierarchical token bucket) root with one class that every packet goes to
  (``default 1``), its ``rate`` and ``ceil`` the bandwidth. HTB is a standard qdisc, built into kernels
  that lack netem (as this project's development VM does), and a token bucket made for shaping links;
* ``latencyMs`` / ``jitterMs`` / ``lossPercent``: netem, without a rate: the root qdisc when no bandwidth
  is set, else the HTB class's leaf (packets wait their delay in netem, then their turn at the rate).

::

    tc qdisc replace dev eth0 root handle 1: htb default 1
    tc class replace dev eth0 parent 1: classid 1:1 htb rate 100mbit ceil 100mbit burst 12500 cburst 12500 \
        quantum 65536
    tc qdisc replace dev eth0 parent 1:1 handle 10: netem limit 1000 delay 20ms 2ms loss random 0.1%

Only netem needs ``sch_netem``: bandwidth alone works on a kernel without it. Both act on what the
interface *sends* (egress). Every worker shapes its own egress, so traffic between two workers is
delayed twice (a round trip gains ``2 x latencyMs``) and each direction is limited to ``bandwidthMbit``.
:func:`netem_commands` is pure (table-tested); :func:`apply` first removes whatever root qdisc the
interface had (so applying again, or other conditions, leaves exactly these), runs the commands and
explains a failure (no CAP_NET_ADMIN, a kernel without netem or htb, a wrong interface).

HTB's class options (tc-htb(8)), chosen here rather than left to tc's defaults:

* ``burst``/``cburst`` (bytes the class may send at once after an idle spell; the same for ceil):
  :func:`burst_bytes`, 1 ms at the rate (tc-tbf(8): at least rate/HZ, so a timer that fires up to a
  millisecond late loses no bandwidth; tc's default, about one packet, makes fast links fall short of
  their rate), at least 1600 (that default), at most 60 s at the rate (HTB's largest debt; tc stores
  the burst as a 32-bit count of clock ticks, which a larger one overflows at very low rates);
* ``quantum`` (bytes per round when classes share spare bandwidth): 64 KiB (:data:`HTB_QUANTUM`), a
  whole segmentation-offload packet per round. With a single class it decides nothing, but unset it
  is rate / r2q, which the kernel clamps with a warning ("quantum of class 10001 is big") above
  16 Mbit/s and below 80 kbit/s.

HTB counts each packet's length with its Ethernet header (and, for an offloaded TCP packet, every
segment's headers), like a wire. The class's default leaf is a pfifo as long as the interface's
txqueuelen (1000 packets on a veth).

netem's units (tc-netem(8)): ``delay TIME [JITTER]`` (jitter: uniform within +-JITTER; netem may
reorder packets then), ``loss random PERCENT``, ``limit PACKETS`` (netem's queue, 1000 by default).
Every packet waiting out its delay, and under HTB its turn at the rate, sits in that queue, so a fixed
1000 would cap a latency-only link at 1000 packets per ``latencyMs`` (about 240 Mbit/s at 50 ms):
:func:`queue_limit` sizes it from the rate (or :data:`ASSUMED_LINE_RATE_MBIT` without one) times the delay.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from mlbench_api.config import RunConfig
from mlbench_api.contract import ENV_CONFIG
from mlbench_api.errors import format_errors
from mlbench_api.network import NetworkConditions

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

#: The HTB root qdisc, its one class (every packet's: ``default 1``) and netem's handle as that class's leaf.
HTB_HANDLE = "1:"
HTB_CLASS = "1:1"
NETEM_LEAF_HANDLE = "10:"
#: HTB's burst covers this long at the rate (tc-tbf(8): at least rate/HZ; HZ is at most 1000).
BURST_SECONDS = 0.001
#: ... and at least this many bytes (tc's own default burst: its assumed MTU, 1600).
MIN_BURST_BYTES = 1600
#: ... and at most this long at the rate (HTB's largest debt is 60 s; tc's 32-bit ticks overflow at ~274 s).
MAX_BURST_SECONDS = 60
#: HTB's quantum: one 64 KiB segmentation-offload packet per round (within the kernel's 1000..200000).
HTB_QUANTUM = 65536


class NetemError(RuntimeError):
    """tc refused or failed; the message says why and what to change."""


def queue_limit(conditions: NetworkConditions) -> int:
    """netem's ``limit``: twice the packets a link at the rate has in flight during the longest delay."""
    delay_s = ((conditions.latency_ms or 0.0) + (conditions.jitter_ms or 0.0)) / 1000.0
    rate_bytes = (conditions.bandwidth_mbit or ASSUMED_LINE_RATE_MBIT) * 1e6 / 8
    packets = math.ceil(round(2 * rate_bytes * delay_s / MTU_BYTES, 6))  # no float noise above a whole number
    return min(MAX_LIMIT, max(DEFAULT_LIMIT, packets))


def rate_bits(mbit: float) -> int:
    """The rate tc is given, in bits per second (tc stores bytes per second: below 8 bit/s would mean 0)."""
    return max(8, round(mbit * 1e6))


def burst_bytes(mbit: float) -> int:
    """HTB's ``burst`` (and ``cburst``) for a rate: :data:`BURST_SECONDS` at the rate, at least
    :data:`MIN_BURST_BYTES`, at most :data:`MAX_BURST_SECONDS` at the rate (at least 1 byte)."""
    rate_bytes = rate_bits(mbit) / 8
    wanted = max(MIN_BURST_BYTES, math.ceil(round(rate_bytes * BURST_SECONDS, 6)))
    return max(1, min(wanted, math.floor(rate_bytes * MAX_BURST_SECONDS)))


def format_time(ms: float) -> str:
    """A tc TIME: whole milliseconds as ``20ms``, anything finer in whole microseconds (``1500us``)."""
    if float(ms).is_integer():
        return f"{int(ms)}ms"
    return f"{round(ms * 1000)}us"


def format_rate(mbit: float) -> str:
    """A tc RATE in bits per second, in the largest exact unit (``100mbit``, ``1500kbit``, ``12345bit``)."""
    bits = rate_bits(mbit)
    for unit, size in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % size == 0:
            return f"{bits // size}{unit}"
    return f"{bits}bit"


def format_percent(value: float) -> str:
    """A tc PERCENT without an exponent (``0.001%``, ``1%``)."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return f"{text}%"


def uses_netem(conditions: NetworkConditions) -> bool:
    """Whether the conditions need netem: latencyMs or lossPercent declared (bandwidth alone is HTB's)."""
    return conditions.latency_ms is not None or conditions.loss_percent is not None


def qdiscs(conditions: NetworkConditions) -> list[str]:
    """The qdisc kinds the conditions are put on the interface with, root first."""
    return [*(["htb"] if conditions.bandwidth_mbit is not None else []), *(["netem"] if uses_netem(conditions) else [])]


def htb_class_options(mbit: float) -> list[str]:
    """The HTB class for a bandwidth: rate = ceil, burst = cburst (:func:`burst_bytes`), quantum."""
    rate, burst = format_rate(mbit), str(burst_bytes(mbit))
    return ["rate", rate, "ceil", rate, "burst", burst, "cburst", burst, "quantum", str(HTB_QUANTUM)]


def netem_options(conditions: NetworkConditions) -> list[str]:
    """The netem options for ``conditions``: limit, then delay [jitter] and loss where set (no rate: HTB's)."""
    out = ["limit", str(queue_limit(conditions))]
    if conditions.latency_ms is not None:
        out += ["delay", format_time(conditions.latency_ms)]
        if conditions.jitter_ms:
            out.append(format_time(conditions.jitter_ms))
    if conditions.loss_percent:
        out += ["loss", "random", format_percent(conditions.loss_percent)]
    return out


def netem_commands(conditions: NetworkConditions, interface: str = DEFAULT_INTERFACE) -> list[list[str]]:
    """The tc command lines (argv) that put ``conditions`` on ``interface``'s egress, root first.

    Bandwidth: an HTB root and its class; latency/jitter/loss: netem, the root without a bandwidth, else
    the class's leaf. Run on an interface whose root qdisc is the default (:func:`apply` sees to that).
    """
    dev = ["tc", "qdisc", "replace", "dev", interface]
    commands: list[list[str]] = []
    netem_parent = ["root"]
    if conditions.bandwidth_mbit is not None:
        commands.append([*dev, "root", "handle", HTB_HANDLE, "htb", "default", HTB_CLASS.split(":")[1]])
        htb_class = ["tc", "class", "replace", "dev", interface, "parent", HTB_HANDLE, "classid", HTB_CLASS, "htb"]
        commands.append([*htb_class, *htb_class_options(conditions.bandwidth_mbit)])
        netem_parent = ["parent", HTB_CLASS, "handle", NETEM_LEAF_HANDLE]
    if uses_netem(conditions):
        commands.append([*dev, *netem_parent, "netem", *netem_options(conditions)])
    return commands


def describe(conditions: NetworkConditions, interface: str = DEFAULT_INTERFACE) -> str:
    """One line naming the qdiscs and what each one does, e.g. for the init container's log."""
    parts = []
    if conditions.bandwidth_mbit is not None:
        mbit = conditions.bandwidth_mbit
        parts.append(f"htb {HTB_HANDLE} (rate {format_rate(mbit)}, burst {burst_bytes(mbit)} bytes)")
    if uses_netem(conditions):
        what = " ".join(netem_options(conditions))
        parts.append(f"netem {NETEM_LEAF_HANDLE if parts else 'root'} ({what})")
    return f"{interface} egress: " + " -> ".join(parts)


def show_commands(interface: str = DEFAULT_INTERFACE) -> list[list[str]]:
    """What the interface holds: its qdiscs, and HTB's classes (none without HTB)."""
    return [["tc", "qdisc", "show", "dev", interface], ["tc", "class", "show", "dev", interface]]


def clear_command(interface: str = DEFAULT_INTERFACE) -> list[str]:
    """Back to the interface's default qdisc: deleting the root deletes HTB's class and leaf with it."""
    return ["tc", "qdisc", "del", "dev", interface, "root"]


#: What tc says when a ``qdisc del ... root`` finds only the default qdisc: nothing to clear.
_NOTHING_TO_CLEAR = ("handle of zero", "No such file or directory")

#: The kernel module, and its config option, of each qdisc kind used here.
_MODULES = {"netem": "CONFIG_NET_SCH_NETEM, module sch_netem", "htb": "CONFIG_NET_SCH_HTB, module sch_htb"}


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
        kind = next((k for k in _MODULES if k in command), None)
        if kind is None:
            return f"{text}; the node's kernel lacks this qdisc"
        extra = " (bandwidthMbit alone needs only htb)" if kind == "netem" else ""
        return (
            f"{text}; the node's kernel has no {kind} qdisc ({_MODULES[kind]}: `modprobe sch_{kind}` on the "
            f"node; on Ubuntu it ships in linux-modules-extra){extra}"
        )
    if "Cannot find device" in stderr:
        return f"{text}; this network namespace has no interface {interface!r} (pass --interface)"
    return text


def run_tc(command: Sequence[str], interface: str) -> str:
    """Run one tc command; its stdout, or :class:`NetemError` with the reason. tc's warnings go to stderr."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        raise NetemError(f"{command[0]} not found: the image needs iproute2 (tc)") from None
    except subprocess.TimeoutExpired:
        raise NetemError(f"{shlex.join(command)} did not finish in 30 s") from None
    if done.returncode != 0:
        raise NetemError(explain(command, done.returncode, done.stderr or done.stdout, interface))
    if done.stderr.strip():  # e.g. "Warning: sch_htb: quantum of class 10001 is big"
        print(f"{shlex.join(command)}: {done.stderr.strip()}", file=sys.stderr)
    return done.stdout


def clear(interface: str = DEFAULT_INTERFACE) -> bool:
    """Delete the root qdisc (and so everything under it); False where there was only the default one."""
    try:
        run_tc(clear_command(interface), interface)
    except NetemError as err:
        if any(words in str(err) for words in _NOTHING_TO_CLEAR):
            return False
        raise
    return True


def show(interface: str = DEFAULT_INTERFACE) -> str:
    """``tc qdisc show`` and ``tc class show``: what the kernel holds."""
    return "".join(run_tc(command, interface) for command in show_commands(interface))


def apply(conditions: NetworkConditions, interface: str = DEFAULT_INTERFACE) -> str:
    """Put ``conditions`` on ``interface`` (whatever root qdisc it had is removed first); returns
    :func:`show` afterwards. A failed command leaves the interface unshaped, not half shaped."""
    clear(interface)
    for command in netem_commands(conditions, interface):
        try:
            run_tc(command, interface)
        except NetemError as err:
            try:
                clear(interface)
            except NetemError as again:
                raise NetemError(f"{err} (removing what was applied before it failed too: {again})") from None
            raise
    return show(interface)


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
    parser.add_argument("--config", help=f"RunConfig JSON/YAML whose network to apply (default ${ENV_CONFIG})")
    parser.add_argument("--bandwidth-mbit", type=float, help="instead of a config: egress rate in Mbit/s")
    parser.add_argument("--latency-ms", type=float, help="instead of a config: delay added to every packet sent")
    parser.add_argument("--jitter-ms", type=float, help="instead of a config: +- variation of the delay")
    parser.add_argument("--loss-percent", type=float, help="instead of a config: packets dropped at random, in %%")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the tc commands, run nothing (applying first removes the interface's previous root qdisc)",
    )
    parser.add_argument(
        "--clear",
        action="store_true",
        help="remove the emulation: delete the root qdisc (htb or netem) and all under it",
    )


def conditions_from_args(args: argparse.Namespace) -> NetworkConditions | None:
    """The flags' conditions, else the run config's ``network`` (None: the run declares none).

    Raises ValueError (a bad value, both flags and --config, no config at all) and OSError (unreadable file).
    """
    given = {wire: getattr(args, attr) for attr, wire in _FLAGS if getattr(args, attr) is not None}
    if given:
        if args.config:
            raise ValueError("pass either --config or the condition flags, not both")
        return NetworkConditions.model_validate(given)
    path = args.config or os.environ.get(ENV_CONFIG)
    if not path:
        raise ValueError(f"pass --config, set {ENV_CONFIG}, or give the conditions as flags")
    return RunConfig.load(path).network


def run(args: argparse.Namespace) -> int:
    """0: applied (or nothing to apply); 1: tc failed; 2: bad input. Prints the commands, the qdiscs used
    (:func:`describe`) and what the interface holds (``tc qdisc show``, ``tc class show``)."""
    if args.clear:
        return _clear(args)
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
    return _apply(conditions, args)


def _clear(args: argparse.Namespace) -> int:
    """``--clear``: the interface back to its default qdisc (``--dry-run``: the command only)."""
    if args.dry_run:
        print(shlex.join(clear_command(args.interface)))
        return 0
    try:
        cleared = clear(args.interface)
    except NetemError as err:
        print(f"error: netem: {err}", file=sys.stderr)
        return 1
    print(f"cleared {args.interface}" if cleared else f"{args.interface} has its default qdisc: nothing to clear")
    return 0


def _apply(conditions: NetworkConditions, args: argparse.Namespace) -> int:
    """The conditions on the interface (``--dry-run``: the commands only)."""
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
    print(f"qdiscs: {describe(conditions, args.interface)}")
    print(shown.rstrip())
    return 0
