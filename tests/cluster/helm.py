"""A real ``helm`` for the chart tests (tests/chart): built from its Go module helm.sh/helm/v3 by
tests/cluster/build-helm.sh into the cache (minutes, once), run with its own config, cache and data dirs so that
no user's repositories or plugins take part."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tests" / "cluster" / "build-helm.sh"
CHART = REPO / "charts" / "mlbench"


def build() -> Path:
    """The helm binary; builds it on first use (minutes), raises when it cannot."""
    out = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD} failed:\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1]) / "bin" / "helm"


@dataclass(frozen=True)
class Helm:
    """``helm`` with private homes under ``home`` and, for the cluster commands, a kubeconfig."""

    binary: Path
    home: Path
    kubeconfig: Path | None = None

    def env(self) -> dict[str, str]:
        dirs = {
            name: str(self.home / name.lower()) for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")
        }
        path = {"PATH": "/usr/bin:/bin", "HOME": str(self.home)}  # client-go's discovery cache: $HOME/.kube
        return {**path, **dirs, **({"KUBECONFIG": str(self.kubeconfig)} if self.kubeconfig else {})}

    def __call__(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env(), check=False, timeout=timeout
        )
        if check and res.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
        return res
