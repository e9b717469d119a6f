"""RBAC manifests, pure: the namespaced install's Roles hold exactly the cluster-wide ClusterRole's rules (so the
two installs cannot drift), the user roles aggregate into edit/admin/view and never write a run's status,
and the kustomize layers build (when a kubectl is at hand)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "manifests" / "operator"
NAMESPACED = REPO / "manifests" / "namespaced"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
READ_VERBS = {"get", "list", "watch"}
RBAC_GROUP = "rbac.authorization.k8s.io"
Obj = dict[str, Any]


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hack_namespaced_rbac", REPO / "hack" / "namespaced-rbac.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_generator()


def docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def find(objs: list[Obj], kind: str, name: str, namespace: str | None = None) -> Obj:
    found = [
        o
        for o in objs
        if o["kind"] == kind and o["metadata"]["name"] == name and o["metadata"].get("namespace") == namespace
    ]
    assert len(found) == 1, f"expected one {kind} {namespace}/{name}, found {len(found)}"
    return found[0]


def triples(rules: list[Obj]) -> set[tuple[str, str, str]]:
    """A rule list as the set of (API group, resource, verb) it grants (resourceNames-free rules only)."""
    out = set()
    for rule in rules:
        assert not {"resourceNames", "nonResourceURLs"} & set(rule), rule
        out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def crd_scope() -> dict[str, str]:
    """mlbench.io resource -> Namespaced / Cluster, from the CRDs themselves."""
    out = {}
    for path in (REPO / "crds" / "bases").glob("*.yaml"):
        for d in docs(path):
            if d.get("kind") == "CustomResourceDefinition":
                out[d["spec"]["names"]["plural"]] = d["spec"]["scope"]
    return out


CLUSTER_RBAC = docs(OPERATOR / "rbac.yaml")
CLUSTER_ROLE = find(CLUSTER_RBAC, "ClusterRole", "mlbench-operator")
NS_RBAC = docs(NAMESPACED / "rbac.yaml")
WATCHED = gen.read_namespaces()
USER_ROLES = docs(OPERATOR / "user-roles.yaml")


def test_the_operator_reads_secrets_only_by_name() -> None:
    """Issue 33: the cluster-wide install's one grant on Secrets is create and get (a 409's owner check, by the
    run's own name): never list or watch (every Secret of the cluster in one call), never a write past create.
    RBAC has no label selector for get and a run's names vary (no resourceNames), so the per-namespace grant is
    the namespaced install's (its Roles hold the same rules: test_each_role_holds_the_cluster_roles_rules)."""
    granted = {verb for group, resource, verb in triples(CLUSTER_ROLE["rules"]) if (group, resource) == ("", "secrets")}
    assert granted == {"create", "get"}
    for role in (o for o in NS_RBAC if o["kind"] == "Role"):
        assert {v for g, r, v in triples(role["rules"]) if (g, r) == ("", "secrets")} <= {"create", "get"}


# -- the namespaced install ------------------------------------------------------------------------------------
def test_generated_files_are_fresh() -> None:
    for path, text in gen.render().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.relative_to(REPO)} is stale: make namespaced-rbac"


def test_example_namespace_is_watched() -> None:
    assert "mlbench-benchmarks" in WATCHED


def test_each_role_holds_the_cluster_roles_rules() -> None:
    """Role (per namespace) + the cluster-scoped remainder == the ClusterRole, with nothing granted twice."""
    cluster_part = find(NS_RBAC, "ClusterRole", "mlbench-operator-cluster")
    everything = triples(CLUSTER_ROLE["rules"])
    assert ("networking.k8s.io", "networkpolicies", "create") in everything
    assert ("networking.k8s.io", "networkpolicies", "get") in everything
    for ns in WATCHED:
        role = find(NS_RBAC, "Role", "mlbench-operator", ns)
        assert triples(role["rules"]) | triples(cluster_part["rules"]) == everything
        assert not triples(role["rules"]) & triples(cluster_part["rules"])
        # the ClusterRole's rules, in its order, less those only a ClusterRole can hold
        assert role["rules"] == [r for r in CLUSTER_ROLE["rules"] if r not in cluster_part["rules"]]
    assert {o["metadata"].get("namespace") for o in NS_RBAC if o["kind"] == "Role"} == set(WATCHED)


def test_cluster_part_is_only_cluster_scoped_resources() -> None:
    """What a Role cannot grant, and nothing more: reading BenchmarkTasks (cluster-scoped, the catalog), Nodes
    by name (the hardware a run's results record: mlbench_api.hardware) and Kueue's ResourceFlavors (the node
    labels of the flavors a queued run was assigned)."""
    scope = crd_scope()
    assert scope == {"benchmarkruns": "Namespaced", "benchmarksweeps": "Namespaced", "benchmarktasks": "Cluster"}
    cluster_part = find(NS_RBAC, "ClusterRole", "mlbench-operator-cluster")
    assert triples(cluster_part["rules"]) == {
        ("mlbench.io", "benchmarktasks", "get"),
        ("", "nodes", "get"),
        ("kueue.x-k8s.io", "resourceflavors", "get"),
    }
    for ns in WATCHED:
        for group, resource, _ in triples(find(NS_RBAC, "Role", "mlbench-operator", ns)["rules"]):
            if group == "mlbench.io":
                assert scope[resource.split("/")[0]] == "Namespaced", resource


def test_bindings_grant_the_operators_service_account() -> None:
    sa = find(CLUSTER_RBAC, "ServiceAccount", "mlbench-operator", "mlbench-system")
    subject = {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    assert find(CLUSTER_RBAC, "ClusterRoleBinding", "mlbench-operator")["subjects"] == [subject]
    for ns in WATCHED:
        binding = find(NS_RBAC, "RoleBinding", "mlbench-operator", ns)
        assert binding["roleRef"] == {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "mlbench-operator"}
        assert binding["subjects"] == [subject]
    crb = find(NS_RBAC, "ClusterRoleBinding", "mlbench-operator-cluster")
    assert crb["roleRef"]["name"] == "mlbench-operator-cluster"
    assert crb["subjects"] == [subject]
    kinds = sorted(o["kind"] for o in NS_RBAC)
    assert kinds == sorted(["Role", "RoleBinding"] * len(WATCHED) + ["ClusterRole", "ClusterRoleBinding"])


def test_deployment_patch_watches_exactly_the_listed_namespaces() -> None:
    ops = yaml.safe_load((NAMESPACED / "deployment-patch.yaml").read_text(encoding="utf-8"))
    assert ops == [
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": f"--namespace={ns}"} for ns in WATCHED
    ]


def test_split_rules_splits_mixed_rules_and_refuses_unknown_resources() -> None:
    table = {("", "pods"): True, ("", "nodes"): False}
    mixed = {"apiGroups": [""], "resources": ["pods", "pods/log", "nodes"], "verbs": ["get"]}
    assert gen.split_rules([mixed], table) == (
        [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get"]}],
        [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
    )
    with pytest.raises(SystemExit, match="unknown"):
        gen.split_rules([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}], table)
    with pytest.raises(SystemExit, match="one API group"):
        gen.split_rules([{"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}], table)


def test_namespaces_file_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "namespaces.txt"
    path.write_text("# comment\nteam-a  # trailing\n\nteam-b\n")
    assert gen.read_namespaces(path) == ["team-a", "team-b"]
    for bad in ("Team_A\n", "# nothing\n", "a\na\n"):
        path.write_text(bad)
        with pytest.raises(SystemExit):
            gen.read_namespaces(path)


# -- user roles ------------------------------------------------------------------------------------------------
def user_role(name: str) -> Obj:
    return find(USER_ROLES, "ClusterRole", name)


def test_user_roles_aggregate_into_the_builtin_roles() -> None:
    edit = user_role("mlbench-edit")["metadata"]["labels"]
    view = user_role("mlbench-view")["metadata"]["labels"]
    assert edit["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit
    assert view["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert not {k for k in view if k.endswith(("aggregate-to-edit", "aggregate-to-admin"))}
    # the catalog reader is bound explicitly, cluster-wide: aggregated, it would be in namespace roles for nothing
    assert not [k for k in user_role("mlbench-catalog-reader")["metadata"]["labels"] if "aggregate" in k]
    assert len(USER_ROLES) == 3


def test_user_roles_grant_what_users_do() -> None:
    edit = triples(user_role("mlbench-edit")["rules"])
    view = triples(user_role("mlbench-view")["rules"])
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"):
        assert ("mlbench.io", "benchmarkruns", verb) in edit
    for resource in ("benchmarkruns", "benchmarkruns/status", "benchmarktasks"):
        for verb in READ_VERBS:
            assert ("mlbench.io", resource, verb) in view
            assert ("mlbench.io", resource, verb) in edit
    assert {v for _, _, v in view} == READ_VERBS
    catalog = triples(user_role("mlbench-catalog-reader")["rules"])
    assert catalog == {("mlbench.io", "benchmarktasks", v) for v in READ_VERBS}


def test_user_roles_never_write_status_or_the_catalog() -> None:
    """Only the operator writes a run's status; the (cluster-scoped, shared) task catalog is the admin's."""
    for role in USER_ROLES:
        for group, resource, verb in triples(role["rules"]):
            assert "*" not in (group, resource, verb), role["metadata"]["name"]
            assert group == "mlbench.io"
            if resource in ("benchmarkruns/status", "benchmarkruns/finalizers", "benchmarktasks"):
                assert verb in READ_VERBS, (role["metadata"]["name"], resource, verb)
            assert verb not in {"escalate", "bind", "impersonate"}


# -- kustomize ---------------------------------------------------------------------------------------------------
def kubectl_bin() -> str:
    from tests.cluster.plugin import _resolve_kubectl

    built = _resolve_kubectl(external=False)
    if Path(built).exists():
        return built
    found = shutil.which("kubectl")
    if not found:
        pytest.skip(f"no kubectl for `kubectl kustomize`: not built at {built} (`make k8s-bins`), none on PATH")
    return found


def kustomize(path: Path) -> list[Obj]:
    res = subprocess.run([kubectl_bin(), "kustomize", str(path)], check=False, capture_output=True, text=True)
    assert res.returncode == 0, f"kubectl kustomize {path} failed: {res.stderr}"
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def ids(objs: list[Obj]) -> set[tuple[str, str, str]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs}


@pytest.mark.multiproc
def test_cluster_wide_install_builds() -> None:
    objs = kustomize(OPERATOR)
    assert {
        ("ClusterRole", "", "mlbench-operator"),
        ("ClusterRoleBinding", "", "mlbench-operator"),
        ("ClusterRole", "", "mlbench-edit"),
        ("ClusterRole", "", "mlbench-view"),
        ("ClusterRole", "", "mlbench-catalog-reader"),
    } <= ids(objs)
    # Roles only in the operator's own namespace (its leader-election Lease) and in kube-node-lease (reading the
    # kubelets' Leases), none in a namespace of runs
    namespaces = {o["metadata"]["namespace"] for o in objs if o["kind"] in ("Role", "RoleBinding")}
    assert namespaces <= {"mlbench-system", "kube-node-lease"}
    leases = find(objs, "Role", "mlbench-operator-node-leases", "kube-node-lease")
    assert leases["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}]
    deployment = find(objs, "Deployment", "mlbench-operator", "mlbench-system")
    assert not [a for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"] if "namespace" in a]
    assert ids(objs) <= ids(kustomize(REPO / "manifests" / "default"))


@pytest.mark.multiproc
def test_namespaced_install_builds() -> None:
    cluster_wide = kustomize(OPERATOR)
    objs = kustomize(NAMESPACED)
    dropped = {("ClusterRole", "", "mlbench-operator"), ("ClusterRoleBinding", "", "mlbench-operator")}
    added = ids(NS_RBAC)
    assert ids(objs) == (ids(cluster_wide) - dropped) | added
    assert len(objs) == len(cluster_wide) - len(dropped) + len(added)
    for obj in NS_RBAC:  # the generated objects, as generated
        meta = obj["metadata"]
        assert find(objs, obj["kind"], meta["name"], meta.get("namespace")) == obj
    args = find(objs, "Deployment", "mlbench-operator", "mlbench-system")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    original = find(cluster_wide, "Deployment", "mlbench-operator", "mlbench-system")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert args == [*original, *(f"--namespace={ns}" for ns in WATCHED)]
