"""Helm post-renderer of the e2e install: ``post_render.py KUBECTL`` reads the chart's rendered objects on stdin and
prints them with tests/e2e/deploy/kustomization.yaml's patches applied (``kubectl kustomize`` of a copy of that
directory with the objects as its ``chart.yaml``): the operator's settings the chart's values cannot express."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent / "deploy"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: post_render.py KUBECTL < rendered.yaml", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mlbench-post-render-") as tmp:
        shutil.copy(DEPLOY / "kustomization.yaml", tmp)
        (Path(tmp) / "chart.yaml").write_text(sys.stdin.read())
        proc = subprocess.run([argv[0], "kustomize", tmp], capture_output=True, text=True, check=False)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
