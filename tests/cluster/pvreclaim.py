"""Recycle the real node's ``local`` PersistentVolumes once their claim is gone.

Why: ``kubernetes.io/no-provisioner`` volumes are never cleaned by Kubernetes; in a
real cluster the local static provisioner wipes a Released volume and offers it
again.  Without this, every test namespace that claims a volume (the operator makes a
dataset PVC per namespace) would use one of the few PVs up for good.

Run by ``LocalCluster`` as the ``pv-reclaimer`` component::

    python -m tests.cluster.pvreclaim --kubectl K --kubeconfig KC --pv-dir DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.cluster.node import LOCAL_PV_LABEL, wipe_dir_contents


def released_volumes(pvs: list[dict[str, Any]], pv_dir: Path) -> list[tuple[str, Path]]:
    """(name, path) of our Released volumes whose path lies under ``pv_dir`` (never
    wipe anything else, whatever a PV object says)."""
    out = []
    base = pv_dir.resolve()
    for pv in pvs:
        if pv.get("status", {}).get("phase") != "Released":
            continue
        spec = pv.get("spec", {})
        path = Path((spec.get("local") or spec.get("hostPath") or {}).get("path", "/")).resolve()
        if path.parent == base:
            out.append((pv["metadata"]["name"], path))
    return out


def reclaim_once(kubectl: list[str], pv_dir: Path) -> list[str]:
    res = subprocess.run(
        [*kubectl, "get", "pv", "-l", f"{LOCAL_PV_LABEL}=true", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    if res.returncode != 0:
        return []
    done = []
    for name, path in released_volumes(json.loads(res.stdout)["items"], pv_dir):
        wipe_dir_contents(path)
        path.chmod(0o777)
        patch = json.dumps([{"op": "remove", "path": "/spec/claimRef"}])
        r = subprocess.run(
            [*kubectl, "patch", "pv", name, "--type=json", "-p", patch],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        if r.returncode == 0:
            done.append(name)
            print(f"{time.strftime('%F %T')} reclaimed {name} ({path})", flush=True)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.pvreclaim")
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--pv-dir", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args(argv)
    kubectl = [args.kubectl, f"--kubeconfig={args.kubeconfig}", "--request-timeout=15s"]
    while True:
        try:
            reclaim_once(kubectl, args.pv_dir)
        except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
            print(f"{time.strftime('%F %T')} reclaim pass failed: {exc}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
