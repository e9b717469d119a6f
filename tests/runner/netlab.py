"""Two network namespaces joined by a link, and a two-rank gloo all-reduce between them.

Shared by tests/runner/test_netem.py (``mlbench-runner netem`` in each namespace: tc htb for the
bandwidth, tc netem for delay and loss, as the worker pods' init container applies them) and
benchmarks/network_conditions.py. Needs root (``ip netns``); every namespace is
deleted on the way out, whatever happened. ``python -m tests.runner.netlab rank ...`` is one rank
(started inside its namespace with ``ip netns exec``).

The all-reduce loop reduces the same tensor in place, so every call on a rank starts after its
previous call returned. That gives a lower bound that needs no model of gloo's algorithm: rank 0's
k-th result needs rank 1's k-th input, sent after rank 1's (k-1)-th result, which needed rank 0's
(k-1)-th input. So two calls span at least one delay in each direction:
``total(N calls) >= N/2 x (delay a->b + delay b->a)`` for even N, counted from the end of a previous call.
A rate bounds it too: rank 0's result minus its own input is rank 1's input, so every call carries each
rank's whole message across each direction (gloo sends the raw floats):
``total(N calls) >= N x bytes x 8 / rate`` (less what a token bucket's burst lets through at once).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The rendezvous port inside namespace a (fresh namespaces: nothing else listens there).
PORT = 29500
#: Float32 doubling per call (see :func:`rank_main`) stays exact below 2**127.
MAX_CALLS = 120
_names = itertools.count()


def in_ns(ns: str, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def sh(argv: Sequence[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@contextmanager
def namespace(tag: str) -> Iterator[str]:
    """A fresh network namespace with ``lo`` up; deleted (with its interfaces) on exit."""
    name = f"mlbench-{tag}-{os.getpid()}-{next(_names)}"
    sh(["ip", "netns", "add", name])
    try:
        sh(["ip", "-n", name, "link", "set", "lo", "up"])
        yield name
    finally:
        sh(["ip", "netns", "del", name], check=False)


def unavailable() -> str | None:
    """Why network namespaces cannot be used here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) is not installed"
    try:
        with namespace("probe"):
            pass
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        return f"cannot create a network namespace: {err}"
    return None


#: A hand-written probe per qdisc kind (the commands under test are not used to decide whether to test them).
_PROBES = {
    "netem": ["netem", "delay", "1ms"],
    "htb": ["handle", "1:", "htb", "default", "1"],
}
#: Where each kind comes from, for the skip reason.
_MODULES = {"netem": "CONFIG_NET_SCH_NETEM / sch_netem", "htb": "CONFIG_NET_SCH_HTB / sch_htb"}


def qdisc_unavailable(kind: str) -> str | None:
    """Why tc cannot put a ``kind`` qdisc (netem, htb) on an interface here (None: it can)."""
    why = unavailable()
    if why:
        return why
    with namespace("probe") as ns:
        done = sh(in_ns(ns, ["tc", "qdisc", "add", "dev", "lo", "root", *_PROBES[kind]]), check=False)
    if done.returncode != 0:
        return f"this kernel has no {kind} qdisc ({_MODULES[kind]}): {done.stderr.strip()}"
    return None


def netem_unavailable() -> str | None:
    """Why tc netem cannot be used here (None: it can)."""
    return qdisc_unavailable("netem")


@dataclass(frozen=True)
class Side:
    ns: str
    interface: str
    address: str


@contextmanager
def veth_pair(subnet: str = "10.213.0") -> Iterator[tuple[Side, Side]]:
    """Namespaces a and b joined by a veth pair: ``<subnet>.1`` on a's ``mlb0``, ``<subnet>.2`` on b's ``mlb1``."""
    with ExitStack() as stack:
        a = stack.enter_context(namespace("a"))
        b = stack.enter_context(namespace("b"))
        sh(["ip", "-n", a, "link", "add", "mlb0", "type", "veth", "peer", "name", "mlb1", "netns", b])
        sides = (Side(a, "mlb0", f"{subnet}.1"), Side(b, "mlb1", f"{subnet}.2"))
        for side in sides:
            sh(["ip", "-n", side.ns, "addr", "add", f"{side.address}/24", "dev", side.interface])
            sh(["ip", "-n", side.ns, "link", "set", side.interface, "up"])
        yield sides


def python_env() -> dict[str, str]:
    """The environment for a child Python that imports mlbench_* and tests.* from this checkout."""
    env = dict(os.environ)
    roots = [str(REPO), str(REPO / "crds"), str(REPO / "runners")]
    env["PYTHONPATH"] = os.pathsep.join([*roots, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return env


def runner_cli(side: Side, args: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``mlbench-runner <args>`` inside ``side``'s namespace (as the init container runs it in a pod's)."""
    argv = in_ns(side.ns, [sys.executable, "-m", "mlbench_runner.cli", *args])
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout, env=python_env())


@dataclass(frozen=True)
class Timing:
    """One message size on rank 0: each call's seconds, and the whole loop's (from the end of a warm-up call)."""

    size: int
    calls: list[float]
    total: float


def allreduce(
    a: Side,
    b: Side,
    sizes: Sequence[int],
    calls: int | Sequence[int],
    *,
    warmup: int = 2,
    timeout: float = 180,
) -> dict[int, Timing]:
    """Run the two ranks (rank 0 in a, the rendezvous there); rank 0's timings per message size in bytes
    (``calls``: timed calls, for every size or per size)."""
    counts = [calls] * len(sizes) if isinstance(calls, int) else list(calls)
    if len(counts) != len(sizes) or warmup < 1 or any(c < 1 or warmup + c > MAX_CALLS for c in counts):
        raise ValueError(f"need one count per size, 1 <= warmup and warmup + calls <= {MAX_CALLS}")
    procs = []
    for rank, side in enumerate((a, b)):
        argv = [sys.executable, "-m", "tests.runner.netlab", "rank", "--rank", str(rank), "--master", a.address]
        argv += ["--sizes", ",".join(map(str, sizes)), "--calls", ",".join(map(str, counts))]
        argv += ["--warmup", str(warmup)]
        env = {**python_env(), "GLOO_SOCKET_IFNAME": side.interface, "OMP_NUM_THREADS": "1"}
        procs.append(
            subprocess.Popen(
                in_ns(side.ns, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
            )
        )
    outputs = []
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        if proc.returncode != 0:
            raise RuntimeError(f"rank {rank} exited {proc.returncode}: {err.strip()[-2000:]}")
    result = json.loads(outputs[0][0].strip().splitlines()[-1])
    return {int(size): Timing(int(size), t["calls"], t["total"]) for size, t in result.items()}


def rank_main(argv: Sequence[str]) -> int:
    """One rank: per size, ``warmup`` then ``calls`` in-place sum all-reduces of a float32 tensor.

    Rank r starts from r + 1 everywhere, so after n calls every element is 3 x 2**(n-1) on both ranks:
    checked at the end (a wrong sum exits 1). Rank 0 prints its timings as one JSON line.
    """
    parser = argparse.ArgumentParser(prog="netlab rank")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated")
    parser.add_argument("--calls", required=True, help="timed calls per size, comma-separated")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from mlbench_runner.comm import TorchCommunicator
    from mlbench_runner.world import World

    torch.set_num_threads(1)
    world = World(args.rank, 2, 0, 1, args.master, PORT, "env")
    comm = TorchCommunicator(world, "gloo", timeout_s=120)
    out: dict[int, dict[str, object]] = {}
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = [int(c) for c in args.calls.split(",")]
    for size, count in zip(sizes, counts, strict=True):
        tensor = torch.full((max(1, size // 4),), float(args.rank + 1))
        for _ in range(args.warmup):
            comm.all_reduce_sum_(tensor)
        calls: list[float] = []
        start = time.perf_counter()  # right after a call returned: the lower bound counts from here
        for _ in range(count):
            t0 = time.perf_counter()
            comm.all_reduce_sum_(tensor)
            calls.append(time.perf_counter() - t0)
        total = time.perf_counter() - start
        expected = 3.0 * 2.0 ** (args.warmup + count - 1)
        if not bool((tensor == expected).all()):
            print(f"rank {args.rank}: wrong sum for {size} bytes: {tensor[:4].tolist()} != {expected}", file=sys.stderr)
            return 1
        out[size] = {"calls": calls, "total": total}
    comm.close()
    if args.rank == 0:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["rank"]:
        sys.exit("usage: python -m tests.runner.netlab rank --rank R --master ADDR --sizes B[,B] --calls N[,N]")
    sys.exit(rank_main(sys.argv[2:]))
