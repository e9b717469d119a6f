"""The few Kubernetes API calls the reconciler makes, as raw JSON over the client's transport.

Raw dicts rather than the typed client models: the objects come from the builders (:mod:`.runobjects`,
:mod:`.runpods`, ...) as dicts, and skipping model (de)serialisation matters when a run creates 1000 pods. Every call
is counted in ``mlbench_operator_api_requests_total``. Calls are blocking; the async glue
runs them on a bounded thread pool (:meth:`Kube.run`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from mlbench_api.common import GROUP, VERSION
from mlbench_operator import __version__
from mlbench_operator import metrics as m
from mlbench_operator import naming as n
from mlbench_operator.fairshare import CREATE_SLOTS, FairSlots, Owner
from mlbench_operator.liveness import Progress

T = TypeVar("T")
USER_AGENT = f"mlbench-operator/{__version__}"
#: Where each kubelet renews the Lease named like its node (the node heartbeat the lifecycle controller reads).
NODE_LEASE_NAMESPACE = "kube-node-lease"
_PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Job": "jobs",
    "NetworkPolicy": "networkpolicies",
    "BenchmarkSweep": "benchmarksweeps",
    "PodGroup": "podgroups",
}
#: Kinds the operator may ``get`` (its RBAC): a 403 on creating one is read back (see :meth:`Kube.create`). Not
#: pods: the operator has no ``get`` on them (it watches them), and creates only those it does not see.
READABLE = frozenset(_PLURALS) - {"Pod"}
#: API group/version of the kinds outside core/v1.
_GROUPS = {
    "Job": "/apis/batch/v1",
    "NetworkPolicy": "/apis/networking.k8s.io/v1",
    "BenchmarkSweep": f"/apis/{GROUP}/{VERSION}",
    "PodGroup": "/apis/scheduling.x-k8s.io/v1alpha1",
}


def _collection(obj_or_kind: dict[str, Any] | str, namespace: str) -> tuple[str, str]:
    """(collection path, plural) of a kind in a namespace: core/v1, or the kind's group (:data:`_GROUPS`)."""
    kind = obj_or_kind if isinstance(obj_or_kind, str) else obj_or_kind["kind"]
    plural = _PLURALS[kind]
    prefix = _GROUPS.get(kind, "/api/v1")
    return f"{prefix}/namespaces/{namespace}/{plural}", plural


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        try:
            detail = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            detail = body
        self.detail = str(detail)[:500]  #: the API server's message (e.g. why a create was refused)
        super().__init__(f"{method} {path}: HTTP {status}: {self.detail}")


def transient(err: BaseException) -> bool:
    """Whether a failed API call may pass if retried as is: 429 (throttled), 5xx (an overloaded or failing
    API server) or no answer at all (a timeout, a refused or reset connection). A 4xx refusal (quota,
    policy, an invalid or too large object) will not pass unchanged; an error of ours is no API error."""
    if isinstance(err, ApiError):
        return err.status == 429 or err.status >= 500
    return isinstance(err, OSError | urllib3.exceptions.HTTPError)  # TimeoutError is an OSError


def may_have_applied(err: BaseException) -> bool:
    """Whether a write that failed with ``err`` may have been applied all the same: no answer (a timeout, a reset
    connection: the request may have reached the API server) or a 5xx (a 504 says the API server may still be
    processing it; a 500 may be etcd's timeout of a commit that went through). A 4xx (429 included: rejected
    before it was processed) was not applied; an error of ours sent nothing."""
    if isinstance(err, ApiError):
        return err.status >= 500
    return isinstance(err, OSError | urllib3.exceptions.HTTPError)


#: The API server's whole answer to a JSON patch it cannot apply: a ``test`` operation that failed, or a
#: path that is missing. The apiserver's patch handler answers 422 through apimachinery's
#: ``NewGenericServerResponse``, which drops the patch library's own words ("testing value ... failed")
#: and names no object or field. A refusal by the schema (a value out of range) is a 422 too, but its
#: message names the object and the field (``BenchmarkRun.mlbench.io "r" is invalid: status.progress...``).
PATCH_NOT_APPLICABLE = "the server rejected our request due to an error in our request"


def patch_test_failed(err: ApiError) -> bool:
    """Whether a JSON patch was refused because one of its operations did not apply (its ``test``
    preconditions: an expected outcome), rather than because the patched object is invalid (a bug to show)."""
    return err.status == 422 and err.detail == PATCH_NOT_APPLICABLE


def load_configuration(kubeconfig: str | None = None) -> k8s.Configuration:
    """In-cluster service account when running in a pod, else the kubeconfig ($KUBECONFIG)."""
    cfg = k8s.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        k8s_config.load_incluster_config(client_configuration=cfg)
    else:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = 32
    return cfg


#: Objects per page of every listing the operator makes (and kopf's ``watching.chunk_size``): a listing of
#: every pod in a big cluster is fetched and decoded 500 objects at a time, not as one response.
PAGE_SIZE = 500


def page_query(query: list[tuple[str, str]], limit: int, token: str) -> list[tuple[str, str]]:
    """The query of one page of a listing: ``query`` plus ``limit``, and ``continue`` after the first page."""
    return [*query, ("limit", str(limit)), *([("continue", token)] if token else [])]


def create_owner(obj: Mapping[str, Any]) -> Owner:
    """Whose turn a create is (:mod:`.fairshare`): (its namespace, its run's label, else its own name)."""
    meta = obj.get("metadata") or {}
    run = (meta.get("labels") or {}).get(n.LABEL_RUN) or meta.get("name")
    return str(meta.get("namespace") or ""), str(run or "")


class Kube:
    """Thread-safe, counted API access for the reconciler."""

    def __init__(
        self, configuration: k8s.Configuration | None = None, concurrency: int = 16, create_slots: int = CREATE_SLOTS
    ) -> None:
        self.api = k8s.ApiClient(configuration or load_configuration())
        self.api.user_agent = USER_AGENT
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kube")
        #: Creates in flight, shared fairly between namespaces and runs (:mod:`.fairshare`, ``MLBENCH_CREATE_SLOTS``).
        self.creates = FairSlots(create_slots)
        #: Calls in and out of the pool: what the liveness probe judges (:func:`.liveness.verdict`).
        self.progress = Progress()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.api.close()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call on the pool without blocking kopf's event loop (counted in :attr:`progress`)."""
        self.progress.started()
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        finally:
            self.progress.finished()

    # -- transport -------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        resource: str = "",
        raw: bool = False,
    ) -> Any:
        """One API request; returns the decoded JSON answer (``raw``: the text), raises :class:`ApiError` on non-2xx."""
        headers = {"Accept": "*/*" if raw else "application/json", "Content-Type": content_type}
        _, url, headers, data, post = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(method, url, headers, data, post, _request_timeout=(5, 30))
        payload = resp.read()
        m.API_REQUESTS.labels(method, resource or path.rsplit("/", 2)[-2], str(resp.status)).inc()
        # a log tail may start inside a multi-byte character: never fail on decoding
        text = payload.decode(errors="replace") if isinstance(payload, bytes) else str(payload or "")
        if not 200 <= resp.status < 300:
            raise ApiError(resp.status, method, path, text)
        if raw:
            return text
        return json.loads(text) if text else None

    # -- the calls -------------------------------------------------------------------------------
    def get_task(self, name: str) -> dict[str, Any] | None:
        """The cluster-scoped BenchmarkTask, or None when it does not exist."""
        try:
            task: dict[str, Any] = self.request(
                "GET", f"/apis/{GROUP}/{VERSION}/benchmarktasks/{quote(name)}", resource="benchmarktasks"
            )
            return task
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def create(self, obj: dict[str, Any]) -> bool | str:
        """Create a core/v1 object: the UID the API server gave it (True when its answer has none); False if it
        already exists (409 is success: creates are idempotent).

        A 403 may hide an object that exists: quota admission runs before the API server's existence check
        (kubernetes/kubernetes#106842), so re-creating an object in a namespace whose quota it helps use up
        (the operator restarted: it ensures a running run's objects again) is refused, not a conflict. The
        object is read then; if it is there, that is the 409's answer, else the refusal stands.
        """
        path, plural = _collection(obj, obj["metadata"]["namespace"])
        try:
            created = self.request("POST", path, obj, resource=plural)
        except ApiError as err:
            if err.status == 409 or (err.status == 403 and obj["kind"] in READABLE and self._exists(obj)):
                return False
            raise
        uid = ((created or {}).get("metadata") or {}).get("uid") if isinstance(created, dict) else None
        return str(uid) if uid else True

    def _exists(self, obj: dict[str, Any]) -> bool:
        """Whether ``obj``'s name exists in its namespace; False when it cannot be read."""
        try:
            return self.get(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]) is not None
        except ApiError:
            return False

    async def create_many(self, objs: Iterable[dict[str, Any]]) -> list[BaseException | bool | str]:
        """Create objects in parallel on the pool; per-object outcome (the UID or True, False, or the error).

        Each create holds one of :attr:`creates`' slots, given in turn to the namespaces and runs that wait
        (:func:`create_owner`): one run's thousand creates do not queue ahead of another tenant's few.
        A coroutine, not a blocking call run on the pool: a pool thread that waited for other pool
        tasks would deadlock once every thread waits (16 runs fanning out at once).
        """
        results = await asyncio.gather(*(self._create_fairly(o) for o in objs), return_exceptions=True)
        return [r if isinstance(r, (BaseException, str)) else bool(r) for r in results]

    async def _create_fairly(self, obj: dict[str, Any]) -> bool | str:
        async with self.creates.hold(create_owner(obj)):
            return await self.run(self.create, obj)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An object of a kind in ``_PLURALS`` (e.g. Service, Job); None when it does not exist."""
        path, plural = _collection(kind, namespace)
        try:
            obj: dict[str, Any] = self.request("GET", f"{path}/{quote(name)}", resource=plural)
            return obj
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def node(self, name: str) -> dict[str, Any] | None:
        """A Node; None when it no longer exists."""
        try:
            node: dict[str, Any] = self.request("GET", f"/api/v1/nodes/{quote(name)}", resource="nodes")
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return node

    def node_labels(self, name: str) -> dict[str, str] | None:
        """A node's labels (the result's hardware record); None when the node no longer exists."""
        node = self.node(name)
        return None if node is None else dict((node.get("metadata") or {}).get("labels") or {})

    def node_lease(self, name: str) -> dict[str, Any] | None:
        """The Lease a node's kubelet renews (``kube-node-lease/<node>``); None when there is none."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases/{quote(name)}"
        try:
            lease: dict[str, Any] = self.request("GET", path, resource="leases")
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return lease

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None, uid: str | None = None) -> None:
        """Delete one pod (404 is fine); ``grace_seconds=0`` force-deletes a pod whose node is gone.

        With ``uid``, only that very pod: a 409 means the name now belongs to another pod (e.g. the next
        attempt's worker of the same name), which is left alone.
        """
        body: dict[str, Any] = {}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body or None, resource="pods")
        except ApiError as err:
            if err.status != 404 and not (uid and err.status == 409):
                raise

    async def delete_pods_named(
        self,
        namespace: str,
        names: Iterable[str],
        grace_seconds: int | None = None,
        uids: Mapping[str, str] | None = None,
    ) -> None:
        """Delete pods in parallel on the pool (``uids``: name -> the pod's UID, a precondition); raises the
        first error after all were tried (see create_many)."""
        results = await asyncio.gather(
            *(self.run(self.delete_pod, namespace, name, grace_seconds, (uids or {}).get(name)) for name in names),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    def pages(
        self, path: str, query: list[tuple[str, str]], resource: str
    ) -> Iterator[tuple[list[dict[str, Any]], str]]:
        """A listing page by page (:data:`PAGE_SIZE` objects each, decoded one at a time): each page's objects
        and the listing's resourceVersion (the same on every page: one consistent snapshot). A continue token
        that expired (410) raises :class:`ApiError`: the caller lists again."""
        token = ""
        while True:
            answer = self.request("GET", path, query=page_query(query, PAGE_SIZE, token), resource=resource) or {}
            meta = answer.get("metadata") or {}
            yield list(answer.get("items") or []), str(meta.get("resourceVersion") or "")
            token = str(meta.get("continue") or "")
            if not token:
                return

    def _list(self, path: str, query: list[tuple[str, str]], resource: str) -> list[dict[str, Any]]:
        return [obj for items, _ in self.pages(path, query, resource) for obj in items]

    def list_objects(self, path: str, selector: str, resource: str) -> tuple[list[dict[str, Any]], str]:
        """The objects of a collection (e.g. ``/api/v1/pods``) matching a label selector, and the listing's
        resourceVersion (where a :meth:`watch` of it starts); paginated (:meth:`pages`)."""
        objs: list[dict[str, Any]] = []
        version = ""
        for items, page_version in self.pages(path, [("labelSelector", selector)], resource):
            objs.extend(items)
            version = page_version
        return objs, version

    def watch(
        self,
        path: str,
        selector: str,
        resource_version: str,
        timeout_seconds: int,
        *,
        resource: str,
        on_response: Callable[[Any], None] | None = None,
    ) -> Iterator[list[dict[str, Any]]]:
        """Watch a collection from ``resource_version``: its events (``{"type", "object"}``: ADDED, MODIFIED,
        DELETED, BOOKMARK, ERROR), decoded, in the batches they arrive in, until the API server ends the
        stream (after ``timeout_seconds``); raises :class:`ApiError` when the watch is refused.

        Blocking: for a thread of its own. ``on_response`` gets the streaming response as soon as it is
        open (its ``shutdown()`` ends the watch from another thread).
        """
        query = [
            ("labelSelector", selector),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        _, url, headers, _, _ = self.api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        # the read timeout only catches a connection that died silently: the server ends the stream first
        resp = self.api.call_api("GET", url, headers, _request_timeout=(5, timeout_seconds + 60))
        m.API_REQUESTS.labels("WATCH", resource, str(resp.status)).inc()
        if not 200 <= resp.status < 300:
            raise ApiError(resp.status, "WATCH", path, resp.read().decode(errors="replace"))
        stream = resp.response
        if on_response is not None:
            on_response(stream)
        try:
            rest = b""
            for chunk in stream.stream(None, decode_content=True):
                *lines, rest = (rest + chunk).split(b"\n")
                events = [json.loads(line) for line in lines if line.strip()]
                if events:
                    yield events
        finally:
            stream.release_conn()

    def probe_runs(self, namespace: str) -> None:
        """List at most one BenchmarkRun of ``namespace``: raises :class:`ApiError` when the operator may not."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/benchmarkruns"
        self.request("GET", path, query=[("limit", "1")], resource="benchmarkruns")

    def post_event(self, event: dict[str, Any]) -> None:
        """Create a core/v1 Event (in its metadata's namespace)."""
        namespace = quote(event["metadata"]["namespace"])
        self.request("POST", f"/api/v1/namespaces/{namespace}/events", event, resource="events")

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods matching ``selector`` (a fetch Job's pods: they are not in the run's pod index)."""
        return self._list(f"/api/v1/namespaces/{namespace}/pods", [("labelSelector", selector)], "pods")

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        """core/v1 Events of ``namespace`` matching ``field_selector`` (e.g. one pod's warnings)."""
        answer = self.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query=[("fieldSelector", field_selector), ("limit", "50")],
            resource="events",
        )
        return list((answer or {}).get("items") or [])

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One pod by name, through ``list`` (the operator may list pods, not get them: RBAC); None when absent.
        What holds a pod's name on a 409 (see ``run.ownership``)."""
        answer = self.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            query=[("fieldSelector", f"metadata.name={name}")],
            resource="pods",
        )
        items = list((answer or {}).get("items") or [])
        return items[0] if items else None

    def read_log(self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int) -> str:
        """The last ``tail_lines`` lines of a container's log, at most ``limit_bytes`` of them (from the start
        of those lines). The kubelet reassembles split long lines, so one line can be any size: the limit
        keeps a pod that prints a giant line from filling the operator's memory."""
        text: str = self.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods/{quote(pod)}/log",
            query=[("container", container), ("tailLines", str(tail_lines)), ("limitBytes", str(limit_bytes))],
            resource="pods/log",
            raw=True,
        )
        return text

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and (in the background) its pods; 404 is fine."""
        try:
            self.request(
                "DELETE",
                f"/apis/batch/v1/namespaces/{namespace}/jobs/{quote(name)}",
                {"propagationPolicy": "Background"},
                resource="jobs",
            )
        except ApiError as err:
            if err.status != 404:
                raise

    def patch_run_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str = "") -> str:
        """Merge-patch a run's status; returns the run's new resourceVersion. Given ``resource_version`` (the
        version the status was computed from), the patch carries it and the API server refuses it with 409
        Conflict when the run changed since: a deposed leader's late write cannot land (see
        :func:`.runtime.fence_version`)."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        answer = self.request(
            "PATCH",
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/benchmarkruns/{name}/status",
            body,
            content_type="application/merge-patch+json",
            resource="benchmarkruns/status",
        )
        return str(((answer or {}).get("metadata") or {}).get("resourceVersion") or "")

    def patch_running_progress(
        self, namespace: str, name: str, progress: dict[str, Any], restarts: int | None = None
    ) -> bool:
        """Set ``status.progress`` only while the run is still Running (and, given ``restarts``, in that
        attempt): a JSON patch whose ``test`` operations make the API server refuse it once the run moved
        on, so a scrape still in flight never overwrites the final figures written at the end (or the
        progress a gang restart cleared). False when refused so; any other refusal (the schema refusing
        the progress value is a 422 as well, :func:`patch_test_failed`) raises.

        A merge patch (kopf's ``patch``) cannot do this: it has no precondition.
        """
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/status/phase", "value": "Running"}]
        if restarts is not None:
            ops.append({"op": "test", "path": "/status/restarts", "value": restarts})
        ops.append({"op": "add", "path": "/status/progress", "value": progress})
        try:
            self.request(
                "PATCH",
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/benchmarkruns/{name}/status",
                ops,
                content_type="application/json-patch+json",
                resource="benchmarkruns/status",
            )
        except ApiError as err:
            if patch_test_failed(err):  # the run is no longer Running (in that attempt)
                return False
            raise
        return True

    def delete_run(self, namespace: str, name: str) -> None:
        try:
            self.request(
                "DELETE",
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/benchmarkruns/{name}",
                {"propagationPolicy": "Background"},
                resource="benchmarkruns",
            )
        except ApiError as err:
            if err.status != 404:
                raise

    # -- BenchmarkSweeps and their runs ----------------------------------------------------------
    def list_runs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """BenchmarkRuns of a namespace matching a label selector (a sweep's runs)."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/benchmarkruns"
        return self._list(path, [("labelSelector", selector)], "benchmarkruns")

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One BenchmarkRun, or None when it does not exist."""
        try:
            run: dict[str, Any] = self.request(
                "GET",
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/benchmarkruns/{quote(name)}",
                resource="benchmarkruns",
            )
            return run
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def create_run(self, obj: dict[str, Any]) -> bool:
        """Create a BenchmarkRun; False if one of that name exists (409)."""
        namespace = obj["metadata"]["namespace"]
        try:
            self.request(
                "POST", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/benchmarkruns", obj, resource="benchmarkruns"
            )
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        return True

    def patch_sweep_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str = "") -> str:
        """Merge-patch a sweep's status, fenced like :meth:`patch_run_status`; returns the new resourceVersion."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        answer = self.request(
            "PATCH",
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/benchmarksweeps/{quote(name)}/status",
            body,
            content_type="application/merge-patch+json",
            resource="benchmarksweeps/status",
        )
        return str(((answer or {}).get("metadata") or {}).get("resourceVersion") or "")
