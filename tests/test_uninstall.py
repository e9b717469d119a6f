"""``make uninstall`` (hack/uninstall.py) against a fake cluster whose runs keep their finalizer until an operator
releases it, and whose CRD deletion would hang while any custom resource of it is left: the runs go first, the
operator's finalizer is removed only from what no operator released, the dataset volumes only when asked."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from mlbench_operator import fetchjob, netpol
from mlbench_operator import naming as n
from mlbench_operator.settings import DatasetSettings
from tests.operator.test_datasets import ctx_for
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[1]


u = load_script("hack/uninstall.py")
Obj = dict[str, Any]
KINDS = {"benchmarkruns": "BenchmarkRun", "benchmarksweeps": "BenchmarkSweep"}


def item(plural: str, name: str, *finalizers: str, namespace: str = "team") -> Obj:
    meta = {"name": name, "namespace": namespace, "finalizers": list(finalizers)}
    return {"kind": KINDS[plural], "metadata": meta}


class FakeCluster:
    """What kubectl would see; ``calls`` records every call's arguments."""

    def __init__(self, operator_running: bool, crds: Sequence[str] = u.CRDS, **objects: list[Obj]) -> None:
        self.operator_running = operator_running
        self.crds = set(crds)
        self.objects = {plural: objects.get(plural, []) for plural in KINDS}
        #: Objects no finalizer holds, by plural: deleted by label selector (``delete <plural> -A -l ...``).
        self.labelled: dict[str, list[Obj]] = {}
        self.calls: list[tuple[str, ...]] = []

    def settle(self) -> None:
        """Deleted objects go when no finalizer holds them (the operator releases its own while it runs)."""
        for plural, items in self.objects.items():
            for obj in items:
                if obj.get("deleting") and self.operator_running and u.FINALIZER in obj["metadata"]["finalizers"]:
                    obj["metadata"]["finalizers"].remove(u.FINALIZER)
            self.objects[plural] = [o for o in items if not (o.get("deleting") and not o["metadata"]["finalizers"])]

    def __call__(self, args: Sequence[str]) -> tuple[int, str, str]:
        args = tuple(args)
        self.calls.append(args)
        verb, what = args[0], args[1]
        if verb == "get" and what == "crd":
            return 0, "".join(f"customresourcedefinition.apiextensions.k8s.io/{c}\n" for c in sorted(self.crds)), ""
        if verb == "get":
            self.settle()
            return 0, json.dumps({"items": self.objects[what]}), ""
        if verb == "delete" and what in self.objects:
            for obj in self.objects[what]:
                obj["deleting"] = True
            self.settle()
        elif verb == "patch":
            (obj,) = [o for o in self.objects[what] if o["metadata"]["name"] == args[2]]
            patch = json.loads(args[args.index("-p") + 1])
            obj["metadata"]["finalizers"] = patch["metadata"]["finalizers"] or []
            self.settle()
        elif verb == "delete" and args[1:3] == ("-k", str(REPO / "manifests" / "operator")):
            self.operator_running = False
        elif verb == "delete" and what in self.labelled:
            selector = args[args.index("-l") + 1]
            self.labelled[what] = [o for o in self.labelled[what] if not selects(selector, o)]
        elif verb == "delete" and what == "crd":
            left = [o for items in self.objects.values() for o in items]
            assert not left, f"deleting the CRDs would hang on {left}"
            self.crds.clear()
        return 0, "", ""

    def verbs(self) -> list[str]:
        """The calls that change the cluster, shortened: 'delete benchmarkruns', 'delete -k manifests/operator'."""
        out = []
        for call in self.calls:
            if call[0] == "get":
                continue
            target = Path(call[2]).relative_to(REPO).as_posix() if call[1] == "-k" else call[2]
            out.append(
                f"{call[0]} {call[1]} {target}"
                if call[1] in ("-k", "crd") or call[0] == "patch"
                else f"{call[0]} {call[1]}"
            )
        return out


def selects(selector: str, obj: Obj) -> bool:
    """Whether a kubectl label selector of ``key=value`` and ``key`` (exists) terms selects ``obj``."""
    labels = obj["metadata"].get("labels") or {}
    terms = [term.partition("=") for term in selector.split(",")]
    return all(key in labels and (not eq or labels[key] == value) for key, eq, value in terms)


def uninstall(cluster: FakeCluster, force: bool = True, delete_datasets: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    rc = u.Uninstall(cluster, sleep=lambda _: None, out=out).run(10.0, force, delete_datasets)
    return rc, out.getvalue()


ORDER = [
    "delete benchmarksweeps",
    "delete benchmarkruns",
    "delete benchmarktasks",
    "delete -k manifests/policy",
    "delete -k manifests/operator",
    "delete jobs",
    "delete networkpolicies",
    "delete crd benchmarkruns.mlbench.io",
]


def test_with_the_operator_running_the_runs_go_first_and_nothing_is_forced() -> None:
    cluster = FakeCluster(
        True,
        benchmarkruns=[item("benchmarkruns", "r1", u.FINALIZER), item("benchmarkruns", "r2", u.FINALIZER)],
        benchmarksweeps=[item("benchmarksweeps", "s1", u.FINALIZER)],
    )
    rc, out = uninstall(cluster)
    assert rc == 0, out
    assert cluster.verbs() == ORDER
    assert "the dataset volumes stay" in out


def test_without_an_operator_only_its_finalizer_is_removed_before_the_crds_go() -> None:
    cluster = FakeCluster(False, benchmarkruns=[item("benchmarkruns", "r1", u.FINALIZER)])
    rc, out = uninstall(cluster)
    assert rc == 0, out
    assert cluster.verbs() == [*ORDER[:2], "patch benchmarkruns r1", *ORDER[2:]]
    assert "still there after 10 s: BenchmarkRun team/r1" in out
    patch = next(c for c in cluster.calls if c[0] == "patch")
    assert patch[patch.index("-n") + 1] == "team"


def test_no_force_stops_before_deleting_anything_else() -> None:
    cluster = FakeCluster(False, benchmarkruns=[item("benchmarkruns", "r1", u.FINALIZER)])
    rc, out = uninstall(cluster, force=False)
    assert rc == 1
    assert cluster.verbs() == ORDER[:2]
    assert "is the operator running?" in out


def test_another_finalizer_is_named_and_kept() -> None:
    held = item("benchmarkruns", "r1", u.FINALIZER, "example.com/backup")
    cluster = FakeCluster(False, benchmarkruns=[held])
    rc, out = uninstall(cluster)
    assert rc == 1
    assert held["metadata"]["finalizers"] == ["example.com/backup"]
    assert "blocked by finalizers not the operator's: BenchmarkRun team/r1" in out
    assert cluster.verbs() == [*ORDER[:2], "patch benchmarkruns r1"]  # the operator and CRDs stay


def test_the_dataset_volumes_go_only_when_asked_and_last() -> None:
    cluster = FakeCluster(True)
    rc, out = uninstall(cluster, delete_datasets=True)
    assert rc == 0
    assert cluster.verbs() == [*ORDER, "delete pvc"]
    pvc = cluster.calls[-1]
    assert pvc[pvc.index("-l") + 1] == u.DATASET_SELECTOR
    assert "dataset volumes stay" not in out


def test_without_crds_the_operator_still_goes() -> None:
    cluster = FakeCluster(True, crds=())
    rc, _ = uninstall(cluster)
    assert rc == 0
    assert cluster.verbs() == ["delete -k manifests/policy", "delete -k manifests/operator", *ORDER[-3:-1]]


@pytest.mark.parametrize(
    ("finalizers", "patched"),
    [
        ([u.FINALIZER], None),
        ([u.FINALIZER, "example.com/x"], ["example.com/x"]),
        (["example.com/x"], "no patch"),
    ],
)
def test_finalizer_patches_remove_only_the_operators(finalizers: list[str], patched: object) -> None:
    patches = u.finalizer_patches([item("benchmarksweeps", "s", *finalizers)])
    if patched == "no patch":
        assert patches == []
        return
    ((plural, namespace, name, patch),) = patches
    assert (plural, namespace, name) == ("benchmarksweeps", "team", "s")
    assert json.loads(patch) == {"metadata": {"finalizers": patched}}


def test_the_dataset_selector_is_the_operators_pvc_labels() -> None:
    labels = fetchjob.dataset_pvc("team", DatasetSettings())["metadata"]["labels"]
    assert dict(kv.split("=") for kv in u.DATASET_SELECTOR.split(",")).items() <= labels.items()


def test_the_fetch_jobs_and_their_network_policies_go_the_runs_objects_are_not_selected() -> None:
    """Issue 33: a dataset's fetch Job and its NetworkPolicy are owned by no run (they outlive the runs): uninstall
    deletes them in every namespace by the operator's labels, after the operator (which would make more). A run's
    own objects are not selected (they go with the run); nor is anyone else's Job."""
    ctx = ctx_for(namespace="team-a")
    job = fetchjob.fetch_job(ctx, DatasetSettings())
    policy = netpol.fetch_network_policy(job["metadata"]["name"], "team-a", ctx.task.dataset.name, None)
    runs_policy = netpol.network_policy(ctx, (), ())
    others = {"metadata": {"name": "backup", "labels": {n.LABEL_MANAGED_BY: "helm", n.LABEL_DATASET: "x"}}}
    cluster = FakeCluster(True)
    cluster.labelled = {"jobs": [job, others], "networkpolicies": [policy, runs_policy]}
    rc, _ = uninstall(cluster)
    assert rc == 0
    assert cluster.verbs() == ORDER
    assert cluster.labelled == {"jobs": [others], "networkpolicies": [runs_policy]}
    deletes = [c for c in cluster.calls if c[:2] in (("delete", "jobs"), ("delete", "networkpolicies"))]
    assert len(deletes) == 2
    for call in deletes:
        assert "--all-namespaces" in call
        assert call[call.index("-l") + 1] == fetchjob.FETCH_SELECTOR
