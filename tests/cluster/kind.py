"""A real ``kind`` for the kind recipe's tests (tests/kind): built from its Go module sigs.k8s.io/kind by
tests/cluster/build-kind.sh into the cache (about a minute of compiling, once; ``make test`` starts it in the
background with the other Go tools, tests/cluster/cluster.mk), and a stand-in ``podman`` for it to drive, which
records every call and starts nothing."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tests" / "cluster" / "build-kind.sh"

#: podman as kind's podman provider sees it: rootful, cgroup v2 with every controller, an overlay store; images and
#: the network present; `run` recorded and answered as started, `logs` saying systemd is up; anything else refused.
#: Each call is one file in $FAKE_PODMAN_CALLS (nanosecond-stamped: kind calls podman from several goroutines).
FAKE_PODMAN = r"""#!/usr/bin/env bash
printf '%q ' "$@" > "$FAKE_PODMAN_CALLS/$(date +%s%N).$$"
case "$1" in
  -v | --version) echo "podman version 5.4.0" ;;
  info) echo '{"host": {"cgroupVersion": "v2", "cgroupControllers": ["cpu", "memory", "pids"],
               "security": {"rootless": false}}, "store": {"graphDriverName": "overlay", "graphStatus": {}}}' ;;
  ps) ;;
  inspect) [ "$2" = --type=image ] || exit 125 ;;
  network) [ "$2" = inspect ] || exit 125 ;;
  volume) [ "$2" = create ] && echo "fake-volume-$$" ;;
  run) ;;
  logs) echo "Reached target Multi-User System." ;;
  *) echo "fake podman: refused: $*" >&2; exit 125 ;;
esac
"""


def build() -> Path:
    """The kind binary; builds it on first use, raises when it cannot."""
    out = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD} failed:\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1]) / "bin" / "kind"


@dataclass(frozen=True)
class Create:
    """What ``kind create cluster`` did against the stand-in podman: its exit status, output and podman calls."""

    returncode: int
    output: str
    calls: list[list[str]]

    def runs(self) -> list[list[str]]:
        """The ``podman run`` calls: one per node container kind would have started."""
        return [c for c in self.calls if c[:1] == ["run"]]


def create_cluster(kind: Path, config: Path, work: Path) -> Create:
    """``kind create cluster --config`` with kind's podman provider on the stand-in podman (nothing is started)."""
    bin_dir, calls = work / "bin", work / "calls"
    bin_dir.mkdir(parents=True)
    calls.mkdir()
    podman = bin_dir / "podman"
    podman.write_text(FAKE_PODMAN)
    podman.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(work),
        "KUBECONFIG": str(work / "kubeconfig"),
        "KIND_EXPERIMENTAL_PROVIDER": "podman",
        "FAKE_PODMAN_CALLS": str(calls),
    }
    res = subprocess.run(
        [str(kind), "create", "cluster", "--config", str(config), "--wait", "0s"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    recorded = [shlex.split(p.read_text()) for p in sorted(calls.iterdir())]
    return Create(res.returncode, res.stdout + res.stderr, recorded)
