#!/usr/bin/env python3
"""Remove MLBench from a cluster without hanging on finalizers (``make uninstall``).

``kubectl delete -k manifests/default`` deletes the operator together with the CRDs, so nothing is left to release
the runs' and sweeps' finalizer (``mlbench.io/operator``, kopf's): the runs, and with them the CRDs, wait forever.
This deletes in the order that lets the operator finish its own work first:

1. the sweeps, then the runs, in every namespace, while the operator still runs, and waits until they are gone
   (their pods, Services, Secrets and ConfigMaps go with them: the run owns them);
2. what is still there after ``--timeout`` (no operator running, or a stuck one) is named, and only the operator's
   finalizer is removed from it (``--no-force``: stop there instead, exit 1, having deleted nothing else); what
   another finalizer still holds is named and stops the uninstall (exit 1): it is not this tool's to remove;
3. the task catalog (BenchmarkTasks), the admission policy, the operator (its namespace, RBAC, Deployment), then
   (after step 4) the CRDs;
4. the fetch Jobs and their NetworkPolicies in every namespace (owned by no run: they outlive the runs; selected
   by the operator's labels), once the operator that creates them is gone;
5. the namespaces' dataset volumes (PVC ``mlbench-datasets``, whatever was fetched into them) only with
   ``--delete-datasets``: by default they stay, and the last line says which and how to delete them.

Usage: hack/uninstall.py [--kubectl PATH] [--timeout SECONDS] [--delete-datasets] [--no-force]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlbench_api.common import GROUP
from mlbench_operator.fetchjob import DATASET_PVC_LABELS, FETCH_SELECTOR
from mlbench_operator.naming import FINALIZER

ROOT = Path(__file__).resolve().parents[1]
#: Deleted and waited for while the operator runs, in this order (a sweep creates runs: it goes first).
WORKLOADS = ("benchmarksweeps", "benchmarkruns")
CRDS = tuple(f"{plural}.{GROUP}" for plural in ("benchmarksweeps", "benchmarkruns", "benchmarktasks"))
#: The dataset volumes the operator creates.
DATASET_SELECTOR = ",".join(f"{key}={value}" for key, value in DATASET_PVC_LABELS.items())
#: What the operator creates per namespace and dataset, owned by no run (the runs' own objects go with them).
FETCH_OBJECTS = ("jobs", "networkpolicies")
Obj = dict[str, Any]
#: Runs kubectl with these arguments; returns (exit status, stdout, stderr).
Kubectl = Callable[[Sequence[str]], tuple[int, str, str]]


@dataclass(frozen=True)
class Step:
    """One kubectl call of the plan, and why it comes where it does."""

    args: tuple[str, ...]
    why: str


def delete_workloads(present: set[str]) -> list[Step]:
    """Step 1: delete the sweeps and runs of every namespace, not waiting here (``wait_gone`` does)."""
    return [
        Step(("delete", plural, "--all", "--all-namespaces", "--wait=false"), f"{plural} first: the operator releases")
        for plural in WORKLOADS
        if f"{plural}.{GROUP}" in present
    ]


def delete_the_rest(present: set[str], delete_datasets: bool) -> list[Step]:
    """Steps 3 to 5: the catalog, the policy, the operator, the fetch Jobs and their NetworkPolicies, the CRDs;
    the dataset volumes only if asked."""
    steps = []
    if f"benchmarktasks.{GROUP}" in present:
        steps.append(Step(("delete", "benchmarktasks", "--all", "--wait=true"), "the catalog, before its CRD"))
    for base, why in (("manifests/policy", "the admission policy"), ("manifests/operator", "the operator")):
        steps.append(Step(("delete", "-k", str(ROOT / base), "--ignore-not-found", "--wait=true"), why))
    for kind in FETCH_OBJECTS:
        args = ("delete", kind, "--all-namespaces", "-l", FETCH_SELECTOR, "--ignore-not-found", "--wait=false")
        steps.append(Step(args, "the dataset fetches' (no run owns them), once no operator makes more"))
    if present:
        steps.append(Step(("delete", "crd", *sorted(present), "--ignore-not-found", "--wait=true"), "the CRDs last"))
    if delete_datasets:
        steps.append(
            Step(("delete", "pvc", "--all-namespaces", "-l", DATASET_SELECTOR, "--wait=false"), "--delete-datasets")
        )
    return steps


def finalizer_patches(items: Sequence[Obj]) -> list[tuple[str, str, str, str]]:
    """(plural, namespace, name, merge patch) removing only the operator's finalizer from each left-over object."""
    patches = []
    for item in items:
        meta = item["metadata"]
        finalizers = meta.get("finalizers") or []
        if FINALIZER not in finalizers:
            continue
        plural = item["kind"].lower() + "s"
        keep = [f for f in finalizers if f != FINALIZER]
        patch = json.dumps({"metadata": {"finalizers": keep or None}})
        patches.append((plural, meta.get("namespace", ""), meta["name"], patch))
    return patches


def describe(items: Sequence[Obj]) -> str:
    return ", ".join(
        f"{i['kind']} {i['metadata'].get('namespace')}/{i['metadata']['name']} "
        f"(finalizers {i['metadata'].get('finalizers') or []})"
        for i in items
    )


class Uninstall:
    """The plan's executor: ``kubectl`` is injected (the tests give it a fake cluster), ``sleep`` too."""

    def __init__(self, kubectl: Kubectl, sleep: Callable[[float], None] = time.sleep, out: Any = sys.stdout) -> None:
        self.kubectl = kubectl
        self.sleep = sleep
        self.out = out

    def call(self, step: Step) -> None:
        print(f"uninstall: kubectl {' '.join(step.args)}   # {step.why}", file=self.out)
        rc, _, err = self.kubectl(step.args)
        if rc != 0:
            raise RuntimeError(f"kubectl {' '.join(step.args)} failed: {err.strip()}")

    def present_crds(self) -> set[str]:
        rc, out, err = self.kubectl(("get", "crd", *CRDS, "--ignore-not-found", "-o", "name"))
        if rc != 0:
            raise RuntimeError(f"kubectl get crd failed: {err.strip()}")
        return {line.rpartition("/")[2] for line in out.split()}

    def left_over(self, present: set[str]) -> list[Obj]:
        items: list[Obj] = []
        for plural in WORKLOADS:
            if f"{plural}.{GROUP}" in present:
                rc, out, err = self.kubectl(("get", plural, "--all-namespaces", "-o", "json"))
                if rc != 0:
                    raise RuntimeError(f"kubectl get {plural} failed: {err.strip()}")
                items += json.loads(out)["items"]
        return items

    def wait_gone(self, present: set[str], timeout: float, poll: float = 2.0) -> list[Obj]:
        """Wait up to ``timeout`` seconds for the sweeps and runs to go; what is left then."""
        waited = 0.0
        while (items := self.left_over(present)) and waited < timeout:
            self.sleep(poll)
            waited += poll
        return items

    def run(self, timeout: float, force: bool, delete_datasets: bool) -> int:
        present = self.present_crds()
        for step in delete_workloads(present):
            self.call(step)
        stuck = self.wait_gone(present, timeout)
        if stuck:
            print(f"uninstall: still there after {timeout:.0f} s: {describe(stuck)}", file=self.out)
            if not force:
                print(
                    "uninstall: stopped (--no-force); is the operator running? Nothing else was deleted.", file=self.out
                )
                return 1
            for plural, namespace, name, patch in finalizer_patches(stuck):
                scope = ("-n", namespace) if namespace else ()
                self.call(Step(("patch", plural, name, *scope, "--type=merge", "-p", patch), f"release {FINALIZER}"))
            blocked = self.wait_gone(present, timeout)
            if blocked:
                print(f"uninstall: blocked by finalizers not the operator's: {describe(blocked)}", file=self.out)
                return 1
        for step in delete_the_rest(present, delete_datasets):
            self.call(step)
        if not delete_datasets:
            print(
                "uninstall: the dataset volumes stay (kubectl get pvc -A -l "
                f"{DATASET_SELECTOR}); delete them with --delete-datasets (make uninstall DELETE_DATASETS=1)",
                file=self.out,
            )
        return 0


def subprocess_kubectl(binary: str) -> Kubectl:
    def kubectl(args: Sequence[str]) -> tuple[int, str, str]:
        res = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
        return res.returncode, res.stdout, res.stderr

    return kubectl


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubectl", default=os.environ.get("MLBENCH_KUBECTL") or shutil.which("kubectl") or "kubectl")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the runs to go")
    parser.add_argument("--delete-datasets", action="store_true", help="also delete the dataset volumes (PVCs)")
    parser.add_argument("--no-force", dest="force", action="store_false", help="never remove a finalizer")
    args = parser.parse_args(argv)
    try:
        return Uninstall(subprocess_kubectl(args.kubectl)).run(args.timeout, args.force, args.delete_datasets)
    except RuntimeError as err:
        print(f"uninstall: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
