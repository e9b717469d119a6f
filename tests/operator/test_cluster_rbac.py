"""RBAC on the real API server: the user roles really aggregate into edit/admin/view (a user bound to `edit`
creates a BenchmarkRun, nobody but the operator writes its status), and the namespaced install works: the
operator with only a Role in one namespace (plus reading the cluster-scoped BenchmarkTasks) runs a run there,
with no Forbidden answer, and never touches a run in another namespace."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.plugin import KubeCluster, create_namespace, wait_for
from tests.operator import helpers as h
from tests.operator.conftest import SESSION, SESSION_LABEL, OperatorProcess, Runs, _operator_kubeconfig
from tests.operator.test_rbac_manifests import load_generator

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
USER_ROLES = REPO / "manifests" / "operator" / "user-roles.yaml"
NAMESPACED_RBAC = REPO / "manifests" / "namespaced" / "rbac.yaml"
LEADER_ELECTION = REPO / "manifests" / "operator" / "leader-election.yaml"
SA = "mlbench-operator"
#: APIs of other projects (Kueue, scheduler-plugins) whose CRDs a cluster may or may not have: the tests that need
#: them install them (tests/operator/test_cluster_kueue.py, test_cluster_gang.py), and may have removed them again.
OPTIONAL_API_GROUPS = frozenset({"kueue.x-k8s.io", "scheduling.x-k8s.io"})


def can(
    cluster: KubeCluster, user: str, verb: str, resource: str, namespace: str | None, *, subresource: str = ""
) -> bool:
    """``kubectl auth can-i``; ``namespace`` None asks cluster-wide (as a request on a cluster-scoped resource is:
    with a namespace, the answer for BenchmarkTasks would be a RoleBinding's, which no real request gets)."""
    scope = ["-n", namespace] if namespace is not None else ["--all-namespaces"]
    args = ["auth", "can-i", verb, resource, f"--as={user}", *scope]
    if subresource:
        args.append(f"--subresource={subresource}")
    res = cluster.kubectl(*args)
    answer = res.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {res.stdout}{res.stderr}"
    return answer == "yes"


def run_body(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = h.run(name, workers=2)
    body["metadata"] = {"name": name, "labels": labels or {}}
    return body


# -- (a) user roles ------------------------------------------------------------------------------------------------
@pytest.fixture
def user_bindings(kube_cluster: KubeCluster, namespace: str) -> str:
    """alice: edit, bob: view, carol: admin, in ``namespace`` only (RoleBindings to the built-in roles)."""
    kube_cluster.kubectl("apply", "-f", str(USER_ROLES), check=True)
    for user, role in (("alice", "edit"), ("bob", "view"), ("carol", "admin")):
        kube_cluster.kubectl(
            "-n", namespace, "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}",
            check=True,
        )  # fmt: skip
    # aggregation is the controller manager's: wait until it has folded our rules into the three roles
    wait_for(
        lambda: (
            can(kube_cluster, "alice", "create", "benchmarkruns.mlbench.io", namespace)
            and can(kube_cluster, "carol", "create", "benchmarkruns.mlbench.io", namespace)
            and can(kube_cluster, "bob", "get", "benchmarkruns.mlbench.io", namespace)
        ),
        timeout=30,
        what="mlbench-edit/-view aggregated into edit, admin and view",
    )
    return namespace


@pytest.mark.parametrize("user", ["alice", "carol"])
def test_edit_and_admin_users_run_benchmarks(kube_cluster: KubeCluster, user_bindings: str, user: str) -> None:
    ns = user_bindings
    runs = "benchmarkruns.mlbench.io"
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"):
        assert can(kube_cluster, user, verb, runs, ns), verb
    assert can(kube_cluster, user, "get", runs, ns, subresource="status")
    for verb in ("patch", "update"):  # only the operator writes a run's status
        assert not can(kube_cluster, user, verb, runs, ns, subresource="status"), verb
    assert not can(kube_cluster, user, "create", runs, "default")  # their namespace only
    # BenchmarkTasks are cluster-scoped: a RoleBinding grants nothing on them (the catalog is the admin's)
    for verb in ("get", "list", "create", "delete"):
        assert not can(kube_cluster, user, verb, "benchmarktasks.mlbench.io", None), verb

    # Not just can-i: the requests themselves. No session label: no test operator serves this run.
    name = f"by-{user}"
    as_user = (f"--as={user}", "-n", ns)
    res = kube_cluster.kubectl(*as_user, "create", "-f", "-", input=json.dumps(run_body(name)))
    assert res.returncode == 0, res.stderr
    res = kube_cluster.kubectl(
        *as_user, "patch", "benchmarkrun", name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Succeeded"}}),
    )  # fmt: skip
    assert res.returncode != 0
    assert "forbidden" in res.stderr.lower(), res.stderr
    # through the main resource, a status is accepted and dropped (the status subresource is separate)
    res = kube_cluster.kubectl(
        *as_user, "patch", "benchmarkrun", name, "--type=merge", "-p", json.dumps({"status": {"phase": "Succeeded"}})
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(kube_cluster.kubectl("-n", ns, "get", "benchmarkrun", name, "-o", "json", check=True).stdout)
    assert not got.get("status")
    res = kube_cluster.kubectl(*as_user, "label", "benchmarkrun", name, "team=a")
    assert res.returncode == 0, res.stderr
    for args in (("get", "benchmarktask", h.TASK_NAME), ("create", "-f", "-")):
        res = kube_cluster.kubectl(*as_user, *args, input=json.dumps(h.task(f"by-{user}-{ns}")))
        assert res.returncode != 0
        assert "forbidden" in res.stderr.lower(), res.stderr
    res = kube_cluster.kubectl(*as_user, "delete", "benchmarkrun", name, "--wait=false")
    assert res.returncode == 0, res.stderr


def test_view_users_only_read(kube_cluster: KubeCluster, user_bindings: str) -> None:
    ns = user_bindings
    runs = "benchmarkruns.mlbench.io"
    for verb in ("get", "list", "watch"):
        assert can(kube_cluster, "bob", verb, runs, ns), verb
    assert can(kube_cluster, "bob", "get", runs, ns, subresource="status")
    for verb in ("create", "update", "patch", "delete", "deletecollection"):
        assert not can(kube_cluster, "bob", verb, runs, ns), verb
    assert not can(kube_cluster, "bob", "patch", runs, ns, subresource="status")

    kube_cluster.kubectl("-n", ns, "create", "-f", "-", input=json.dumps(run_body("seen")), check=True)
    as_bob = ("--as=bob", "-n", ns)
    res = kube_cluster.kubectl(*as_bob, "get", "benchmarkrun", "seen", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["metadata"]["name"] == "seen"
    res = kube_cluster.kubectl(*as_bob, "create", "-f", "-", input=json.dumps(run_body("not-bobs")))
    assert res.returncode != 0
    assert "forbidden" in res.stderr.lower(), res.stderr
    res = kube_cluster.kubectl(*as_bob, "delete", "benchmarkrun", "seen", "--wait=false")
    assert res.returncode != 0
    assert "forbidden" in res.stderr.lower(), res.stderr


@pytest.mark.usefixtures("test_task")
def test_catalog_reader_reads_only_the_catalog(kube_cluster: KubeCluster, user_bindings: str) -> None:
    """mlbench-catalog-reader bound cluster-wide: the tasks to choose from, nobody's runs."""
    user = f"dave-{user_bindings}"
    binding = f"mlbench-catalog-reader-{user_bindings}"
    kube_cluster.kubectl(
        "create", "clusterrolebinding", binding, "--clusterrole=mlbench-catalog-reader", f"--user={user}", check=True
    )
    try:
        wait_for(lambda: can(kube_cluster, user, "list", "benchmarktasks.mlbench.io", None), what="binding in effect")
        res = kube_cluster.kubectl(f"--as={user}", "get", "benchmarktask", h.TASK_NAME, "-o", "name")
        assert res.returncode == 0, res.stderr
        assert not can(kube_cluster, user, "create", "benchmarktasks.mlbench.io", None)
        assert not can(kube_cluster, user, "get", "benchmarkruns.mlbench.io", user_bindings)
        assert not can(kube_cluster, user, "list", "benchmarkruns.mlbench.io", None)
    finally:
        kube_cluster.kubectl("delete", "clusterrolebinding", binding, "--ignore-not-found")


# -- (b) the namespaced install --------------------------------------------------------------------------------------
def test_scope_table_matches_the_api_server(kube_cluster: KubeCluster) -> None:
    """hack/namespaced-rbac.py's idea of which resources a Role can grant is the API server's."""
    gen = load_generator()

    def names(namespaced: bool) -> set[str]:
        out = kube_cluster.kubectl("api-resources", f"--namespaced={str(namespaced).lower()}", "-o", "name", check=True)
        return set(out.stdout.split())

    served = {True: names(True), False: names(False)}
    table = gen.scopes()
    for group, resource in table:
        key = f"{resource}.{group}" if group else resource
        if group in OPTIONAL_API_GROUPS and key not in served[True] | served[False]:
            continue  # a third-party API the operator uses only where it is installed: checked when it is served
        assert key in served[table[group, resource]], f"{key}: not served as namespaced={table[group, resource]}"
    for rule in gen.cluster_role_rules():  # every resource the operator uses is classified
        for resource in rule["resources"]:
            gen.is_namespaced(rule["apiGroups"][0], resource, table)


@pytest.fixture
def other_namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    name = create_namespace(kube_cluster)  # restricted, as the `namespace` fixture's
    try:
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def namespaced_rbac(namespace: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """manifests/namespaced/rbac.yaml moved to ``namespace`` (Role, RoleBinding of a ServiceAccount there), with
    the operator's Roles in its own namespace (leader election), also moved there, since the operator's
    ServiceAccount lives there too; and the cluster-scoped part's ClusterRoleBinding, named for the test."""
    docs = [d for d in yaml.safe_load_all(NAMESPACED_RBAC.read_text()) if d]

    def first(kind: str) -> dict[str, Any]:
        return next(d for d in docs if d["kind"] == kind)  # for the first watched namespace, as all are

    own: list[dict[str, Any]] = []
    if LEADER_ELECTION.exists():
        own = [d for d in yaml.safe_load_all(LEADER_ELECTION.read_text()) if d]
        assert {d["kind"] for d in own} <= {"Role", "RoleBinding"}
    role, binding = first("Role"), first("RoleBinding")
    cluster_role, cluster_binding = first("ClusterRole"), first("ClusterRoleBinding")
    subject = {"kind": "ServiceAccount", "name": SA, "namespace": namespace}
    for obj in [role, binding, *own]:
        obj["metadata"]["namespace"] = namespace
        if obj["kind"] == "RoleBinding":
            obj["subjects"] = [subject]
    cluster_binding["metadata"]["name"] = f"mlbench-operator-cluster-{namespace}"
    cluster_binding["subjects"] = [subject]
    return [role, binding, *own, cluster_role], cluster_binding


@pytest.mark.usefixtures("test_task")
def test_namespaced_operator(
    kube_cluster: KubeCluster, namespace: str, other_namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator with a Role in ``namespace`` only, watching it alone (--namespace), runs a run there."""
    objs, cluster_binding = namespaced_rbac(namespace)
    # its Lease where its ServiceAccount may hold one (ignored by an operator without leader election)
    monkeypatch.setenv("MLBENCH_LEADER_ELECTION_NAMESPACE", namespace)
    kube_cluster.kubectl("-n", namespace, "create", "serviceaccount", SA, check=True)
    items = {"kind": "List", "apiVersion": "v1", "items": objs}
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(items), check=True)
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(cluster_binding), check=True)
    user = f"system:serviceaccount:{namespace}:{SA}"
    try:
        assert can(kube_cluster, user, "create", "pods", namespace)
        assert can(kube_cluster, user, "get", "benchmarktasks.mlbench.io", None)
        assert not can(kube_cluster, user, "list", "benchmarktasks.mlbench.io", None)
        assert not can(kube_cluster, user, "list", "pods", other_namespace)
        assert not can(kube_cluster, user, "watch", "benchmarkruns.mlbench.io", other_namespace)
        assert not can(kube_cluster, user, "list", "namespaces", None)
        assert not can(kube_cluster, user, "list", "pods", None)
        assert not can(kube_cluster, user, "watch", "benchmarkruns.mlbench.io", None)

        # A label value of its own: the package's cluster-wide test operator (when the whole suite runs)
        # serves SESSION and must not serve these runs too; other sessions' operators serve their own.
        value = f"{SESSION}-ns"
        selector = f"--selector={SESSION_LABEL}={value}"
        kubeconfig = _operator_kubeconfig(kube_cluster, tmp_path / "kubeconfig", (namespace, SA))
        op = OperatorProcess(kubeconfig, tmp_path / "operator.log", extra_args=[f"--namespace={namespace}", selector])
        op.start()
        mine, theirs = Runs(kube_cluster, namespace), Runs(kube_cluster, other_namespace)
        try:
            for runs in (mine, theirs):
                body = run_body("nsrun", {SESSION_LABEL: value})
                runs.kubectl("apply", "-f", "-", input=json.dumps(body))
            status = mine.wait_status(
                "nsrun", lambda s: s if s.get("phase") in ("Starting", "Running") else None, 60, "Starting/Running"
            )
            assert status["taskSnapshot"]["model"]["depth"] == 20  # the task, read cluster-wide
            wait_for(lambda: {"nsrun-worker-0", "nsrun-worker-1"} <= set(mine.pods("nsrun")), what="workers")
            mine.wait_phase("nsrun", "Running", timeout=60)
            assert set(mine.pods("nsrun")) == {"nsrun-worker-0", "nsrun-worker-1", "nsrun-launcher"}
            assert mine.get("service", "nsrun") is not None
            assert mine.get("configmap", "nsrun-config") is not None
            assert mine.get("secret", "nsrun-ssh") is not None

            # The other namespace's run is not the operator's business (it could not even read it).
            other = theirs.run("nsrun")
            assert not other.get("status")
            assert not other["metadata"].get("finalizers")
            assert not [k for k in other["metadata"].get("annotations") or {} if k.startswith("mlbench.io/")]
            assert not theirs.pods("nsrun")

            log = op.log_path.read_text(errors="replace")
            assert "forbidden" not in log.lower(), op.log_tail(80)
            assert "Not enough permissions" not in log, op.log_tail(80)
            assert op.metric("mlbench_operator_api_requests_total", code="403") == 0
            assert op.metric("mlbench_operator_api_requests_total") > 0
        finally:
            # Let the operator release its finalizer, so that the namespace is not left Terminating.
            mine.kubectl("delete", "benchmarkrun", "nsrun", "--wait=false", check=False)
            deadline = time.monotonic() + 30
            while mine.get("benchmarkrun", "nsrun") is not None and time.monotonic() < deadline:
                time.sleep(0.3)
            op.stop()
            if mine.get("benchmarkrun", "nsrun") is not None:
                mine.kubectl(
                    "patch", "benchmarkrun", "nsrun", "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                    check=False,
                )  # fmt: skip
    finally:
        kube_cluster.kubectl("delete", "clusterrolebinding", cluster_binding["metadata"]["name"], "--ignore-not-found")


def test_the_operator_reads_node_leases_and_nothing_else_of_them(kube_cluster: KubeCluster) -> None:
    """A failed launcher's workers' nodes: the operator may get their kubelets' Leases (node-leases.yaml), only in
    kube-node-lease, and may not list them (it asks by node name) nor write them."""
    for f in ("namespace.yaml", "rbac.yaml", "node-leases.yaml"):
        kube_cluster.kubectl("apply", "-f", str(REPO / "manifests" / "operator" / f), check=True)
    user = f"system:serviceaccount:mlbench-system:{SA}"
    assert can(kube_cluster, user, "get", "leases.coordination.k8s.io", "kube-node-lease")
    assert can(kube_cluster, user, "get", "nodes", None)
    assert not can(kube_cluster, user, "list", "leases.coordination.k8s.io", "kube-node-lease")
    assert not can(kube_cluster, user, "update", "leases.coordination.k8s.io", "kube-node-lease")
    assert not can(kube_cluster, user, "get", "leases.coordination.k8s.io", "kube-system")
