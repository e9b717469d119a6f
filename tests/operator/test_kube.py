"""The operator's API transport without a cluster: fan-outs on the pool, raw and JSON answers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kopf
import pytest
import urllib3
from kubernetes import client as k8s

from mlbench_operator.kube import PATCH_NOT_APPLICABLE, ApiError, Kube, patch_test_failed, transient


def test_concurrent_fan_outs_do_not_deadlock_the_pool() -> None:
    """20 runs fanning out at once on a 2-thread pool: a fan-out that blocked a pool thread while
    waiting for its own pool tasks would wait forever (issue 10)."""
    kube = Kube(k8s.Configuration(), concurrency=2)
    created: list[Any] = []

    def slow_create(obj: dict[str, Any]) -> bool:
        time.sleep(0.01)
        created.append(obj)
        return True

    def slow_delete(namespace: str, name: str, grace_seconds: int | None = None, uid: str | None = None) -> None:
        time.sleep(0.01)

    kube.create = slow_create  # type: ignore[method-assign]
    kube.delete_pod = slow_delete  # type: ignore[method-assign]

    async def crowd() -> list[Any]:
        creates = [kube.create_many([{"n": i} for i in range(3)]) for _ in range(20)]
        deletes = [kube.delete_pods_named("ns", ["a", "b", "c"]) for _ in range(20)]
        return await asyncio.wait_for(asyncio.gather(*creates, *deletes), timeout=30)

    try:
        results = asyncio.run(crowd())
    finally:
        kube.close()
    assert results[:20] == [[True, True, True]] * 20
    assert len(created) == 60


def test_a_failed_create_is_reported_per_object() -> None:
    kube = Kube(k8s.Configuration(), concurrency=2)

    def create(obj: dict[str, Any]) -> bool:
        if obj["n"] == 1:
            raise RuntimeError("refused")
        return obj["n"] == 0

    kube.create = create  # type: ignore[method-assign]
    try:
        out = asyncio.run(kube.create_many([{"n": 0}, {"n": 1}, {"n": 2}]))
    finally:
        kube.close()
    assert out[0] is True
    assert isinstance(out[1], RuntimeError)
    assert out[2] is False


class _Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/api/v1/namespaces/ns/pods/p/log"):
            body, kind = b"line 1\nline \xc3\xa9 2\n", "text/plain"
            limit = parse_qs(urlsplit(self.path).query).get("limitBytes")
            body = body[: int(limit[0])] if limit else body
        else:
            body, kind = b'{"kind": "BenchmarkTask", "spec": {}}', "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[Kube]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cfg = k8s.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    kube = Kube(cfg)
    yield kube
    kube.close()
    server.shutdown()
    server.server_close()


def test_log_reads_are_text_and_other_answers_json(api: Kube) -> None:
    assert api.read_log("ns", "p", "launcher", 10, 1024) == "line 1\nline é 2\n"
    assert api.read_log("ns", "p", "launcher", 10, 8) == "line 1\nl"  # limitBytes is sent
    assert api.get_task("t") == {"kind": "BenchmarkTask", "spec": {}}


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_liveness_fails_when_the_api_pool_is_stuck_not_when_it_is_busy() -> None:
    """Issue 33: the probe judges progress (a call completed while work waits), not the queue's depth: a pool
    with a thousand calls queued that keeps completing them is alive; one whose only thread hangs is not."""
    from mlbench_operator import handlers
    from mlbench_operator.liveness import STALL_SECONDS, Progress

    clock = _Clock()
    kube = Kube(k8s.Configuration(), concurrency=1)
    kube.progress = Progress(clock)
    release = threading.Event()
    probe: Any = handlers.api_progress  # kopf's decorator types it as an activity

    async def scenario() -> None:
        assert (await probe(memo={"kube": kube}))["pending"] == 0
        clock.t += 10 * STALL_SECONDS  # idle for long: alive
        await probe(memo={"kube": kube})
        hung = asyncio.ensure_future(kube.run(release.wait))  # the only thread hangs, as on a stuck API call
        queued = [asyncio.ensure_future(kube.run(bool, 1)) for _ in range(1000)]
        await asyncio.sleep(0.05)
        clock.t += STALL_SECONDS - 1
        assert (await probe(memo={"kube": kube}))["pending"] == 1001  # answered at once, however deep the queue
        clock.t += 2
        with pytest.raises(kopf.PermanentError, match="1001 API calls waiting and none completed for 121s"):
            await probe(memo={"kube": kube})
        release.set()
        await asyncio.gather(hung, *queued)
        assert (await probe(memo={"kube": kube}))["pending"] == 0

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        kube.close()


@pytest.mark.parametrize(
    ("pending", "since", "now", "alive"),
    [
        (0, 0.0, 10_000.0, True),  # idle: alive however long ago the last call was
        (1000, 100.0, 219.0, True),  # a deep queue, a call completed 119 s ago
        (1000, 100.0, 220.0, True),  # exactly the limit
        (1, 100.0, 220.5, False),  # one call waiting, nothing completed for longer than the limit
    ],
)
def test_liveness_verdict(pending: int, since: float, now: float, alive: bool) -> None:
    from mlbench_operator.liveness import Snapshot, verdict

    assert (verdict(Snapshot(pending, since), now, limit=120.0) is None) is alive


def test_progress_counts_from_the_last_completion_or_the_arrival_of_work() -> None:
    from mlbench_operator.liveness import Progress, Snapshot

    clock = _Clock()
    meter = Progress(clock)
    clock.t = 2000.0
    meter.started()  # work arrives at a pool idle since 1000: the wait counts from 2000
    assert meter.snapshot() == Snapshot(1, 2000.0)
    clock.t = 2005.0
    meter.started()
    assert meter.snapshot() == Snapshot(2, 2000.0)  # more work: still from 2000
    clock.t = 2010.0
    meter.finished()
    assert meter.snapshot() == Snapshot(1, 2010.0)  # a completion is progress


class _Watch(BaseHTTPRequestHandler):
    """A pod collection: a listing, and a watch that sends three events in two chunks (one split in two)."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []

    def do_GET(self) -> None:
        _Watch.seen.append(self.path)
        if "watch=true" not in self.path:
            body = b'{"kind": "PodList", "metadata": {"resourceVersion": "41"}, "items": [{"metadata": {"uid": "a"}}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if "forbidden" in self.path:
            body = b'{"kind": "Status", "message": "pods is forbidden"}'
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        lines = [
            b'{"type": "ADDED", "object": {"metadata": {"uid": "b", "resourceVersion": "42"}}}\n',
            b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "43"}}}\n',
            b'{"type": "DELETED", "object": {"metadata": {"uid": "a", "resourceVersion": "44"}}}\n',
        ]
        data = b"".join(lines)
        cut = len(lines[0]) + 20  # the second event arrives in two chunks
        for chunk in (data[:cut], data[cut:]):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def watch_api() -> Iterator[Kube]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Watch)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cfg = k8s.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    kube = Kube(cfg)
    _Watch.seen.clear()
    yield kube
    kube.close()
    server.shutdown()
    server.server_close()


def test_list_then_watch_from_the_listing(watch_api: Kube) -> None:
    """A listing's items and resourceVersion; then the watch from it: decoded events in the batches they
    arrived in (a line split across chunks is joined), until the server ends the stream."""
    items, version = watch_api.list_objects("/api/v1/pods", "app=x", "pods")
    assert (items, version) == ([{"metadata": {"uid": "a"}}], "41")
    responses: list[Any] = []
    batches = list(watch_api.watch("/api/v1/pods", "app=x", version, 30, resource="pods", on_response=responses.append))
    assert [[e["type"] for e in batch] for batch in batches] == [["ADDED"], ["BOOKMARK", "DELETED"]]
    assert len(responses) == 1  # what a stop() shuts down
    query = _Watch.seen[-1]
    for part in ("watch=true", "resourceVersion=41", "allowWatchBookmarks=true", "timeoutSeconds=30"):
        assert part in query


def test_a_refused_watch_raises(watch_api: Kube) -> None:
    from mlbench_operator.kube import ApiError

    with pytest.raises(ApiError, match="pods is forbidden") as err:
        list(watch_api.watch("/api/v1/pods", "forbidden", "1", 30, resource="pods"))
    assert err.value.status == 403


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (ApiError(429, "POST", "/pods", '{"message": "too many requests"}'), True),
        (ApiError(500, "POST", "/pods", '{"message": "etcd timeout"}'), True),
        (ApiError(503, "POST", "/pods", "service unavailable"), True),
        (ApiError(403, "POST", "/pods", '{"message": "exceeded quota"}'), False),
        (ApiError(409, "POST", "/pods", '{"message": "already exists"}'), False),
        (ApiError(413, "POST", "/configmaps", '{"message": "too large"}'), False),
        (ApiError(422, "POST", "/pods", '{"message": "is invalid"}'), False),
        (TimeoutError("timed out"), True),
        (ConnectionRefusedError("refused"), True),
        (urllib3.exceptions.ReadTimeoutError(None, "/pods", "read timed out"), True),  # type: ignore[arg-type]
        (urllib3.exceptions.MaxRetryError(None, "/pods"), True),  # type: ignore[arg-type]
        (KeyError("metadata"), False),  # a bug of ours: no retry hides it
    ],
)
def test_transient_api_errors(err: BaseException, expected: bool) -> None:
    assert transient(err) is expected


_SCHEMA_REFUSAL = {
    "message": 'BenchmarkRun.mlbench.io "late" is invalid: status.progress.epoch: Invalid value: -1: '
    "progress.epoch in body should be greater than or equal to 0",
    "reason": "Invalid",
    "details": {"causes": [{"reason": "FieldValueInvalid", "field": "status.progress.epoch"}]},
    "code": 422,
}


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        # what the API server answered to a failed ``test`` op (tests/operator/test_cluster_progress.py)
        (422, json.dumps({"message": PATCH_NOT_APPLICABLE, "reason": "Invalid", "details": {}, "code": 422}), True),
        (422, json.dumps(_SCHEMA_REFUSAL), False),  # the progress value itself is refused: a bug to show
        (400, json.dumps({"message": PATCH_NOT_APPLICABLE}), False),
        (404, json.dumps({"message": 'benchmarkruns.mlbench.io "late" not found'}), False),
        (500, json.dumps({"message": PATCH_NOT_APPLICABLE}), False),
    ],
)
def test_a_failed_patch_test_is_told_from_a_schema_refusal(status: int, body: str, expected: bool) -> None:
    assert patch_test_failed(ApiError(status, "PATCH", "/status", body)) is expected


@pytest.mark.parametrize(
    ("body", "written"),
    [
        (json.dumps({"message": PATCH_NOT_APPLICABLE, "code": 422}), False),  # the run moved on: dropped
        (json.dumps(_SCHEMA_REFUSAL), None),  # the value is refused: raised, not taken for "no longer Running"
    ],
)
def test_a_refused_progress_patch_is_dropped_only_when_a_test_failed(body: str, written: bool | None) -> None:
    kube = Kube(k8s.Configuration(), concurrency=1)

    def refuse(*_: Any, **__: Any) -> Any:
        raise ApiError(422, "PATCH", "/status", body)

    kube.request = refuse  # type: ignore[method-assign]
    try:
        if written is None:
            with pytest.raises(ApiError, match=r"status\.progress\.epoch"):
                kube.patch_running_progress("ns", "late", {"epoch": -1.0}, 0)
        else:
            assert kube.patch_running_progress("ns", "late", {"epoch": 1.0}, 0) is written
    finally:
        kube.close()


def test_the_deployments_probes() -> None:
    """The startupProbe covers a slow first sync (the pod listing before kopf starts: up to 5 minutes), the
    liveness probe restarts only a pool stuck for longer than the verdict's limit plus the kubelet's retries."""
    from pathlib import Path

    import yaml

    from mlbench_operator.liveness import STALL_SECONDS

    manifest = Path(__file__).parents[2] / "manifests" / "operator" / "deployment.yaml"
    deployment = next(d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    startup, live = container["startupProbe"], container["livenessProbe"]
    assert startup["httpGet"] == live["httpGet"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert live["periodSeconds"] * live["failureThreshold"] < STALL_SECONDS  # the verdict decides, not the kubelet


@pytest.mark.parametrize(
    ("post", "get", "expected"),
    [
        pytest.param(409, None, False, id="409: it exists"),
        pytest.param(403, 200, False, id="403 for one that exists: quota admission before the existence check"),
        pytest.param(403, 404, 403, id="403 for one that does not: the refusal stands"),
        pytest.param(403, 403, 403, id="403 and no get on the kind: the refusal stands"),
        pytest.param(422, None, 422, id="422: invalid, nothing read"),
        pytest.param(201, None, True, id="created"),
    ],
)
@pytest.mark.parametrize("kind", ["PersistentVolumeClaim", "Pod"])
def test_a_create_refused_for_an_object_that_exists_is_a_conflict(
    post: int, get: int | None, expected: Any, kind: str
) -> None:
    """Pods are not read back: the operator may not get them (each refused pod would cost a second 403)."""
    if kind == "Pod" and get is not None:
        expected, get = (403 if post == 403 else expected), None
    kube = Kube(k8s.Configuration(), concurrency=1)
    calls: list[str] = []

    def request(method: str, path: str, body: Any = None, **_: Any) -> Any:
        calls.append(method)
        status = post if method == "POST" else get
        if status is None:
            raise AssertionError(f"unexpected {method} {path}")
        if status >= 300:
            raise ApiError(status, method, path, '{"message": "exceeded quota: persistentvolumeclaims=1"}')
        return {"metadata": {"name": "mlbench-datasets"}}

    kube.request = request  # type: ignore[method-assign]
    pvc = {"kind": kind, "metadata": {"name": "mlbench-datasets", "namespace": "ns"}}
    try:
        if isinstance(expected, bool):
            assert kube.create(pvc) is expected
        else:
            with pytest.raises(ApiError) as err:
                kube.create(pvc)
            assert err.value.status == expected
    finally:
        kube.close()
    assert calls == (["POST", "GET"] if get is not None else ["POST"])


@pytest.mark.parametrize("items", [[], [{"metadata": {"name": "r1-worker-0", "uid": "u"}}]])
def test_a_pod_is_read_by_listing_its_name(items: list[dict[str, Any]]) -> None:
    """The operator may list pods, not get them (RBAC): what holds a pod's name is read with a field selector."""
    kube = Kube(k8s.Configuration(), concurrency=1)
    calls: list[tuple[str, str, Any]] = []

    def request(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        calls.append((method, path, kw.get("query")))
        return {"items": items}

    kube.request = request  # type: ignore[method-assign]
    try:
        assert kube.get_pod("ns", "r1-worker-0") == (items[0] if items else None)
    finally:
        kube.close()
    assert calls == [("GET", "/api/v1/namespaces/ns/pods", [("fieldSelector", "metadata.name=r1-worker-0")])]


class _Paged:
    """A collection of 1200 objects served as the API server does: ``limit`` per page, ``continue`` tokens."""

    def __init__(self) -> None:
        self.queries: list[dict[str, str]] = []

    def __call__(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        query = dict(kw.get("query") or [])
        self.queries.append(query)
        start = int(query.get("continue") or 0)
        end = min(start + int(query["limit"]), 1200)
        meta = {"resourceVersion": "77", **({"continue": str(end)} if end < 1200 else {})}
        return {"metadata": meta, "items": [{"metadata": {"name": f"o{i}"}} for i in range(start, end)]}


@pytest.mark.parametrize("call", ["list_objects", "list_pods", "list_runs"])
def test_every_listing_is_paginated(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """Issue 33: a listing is fetched and decoded PAGE_SIZE objects at a time (limit/continue), not as one
    answer holding every pod of the cluster, and none of the pages is lost."""
    from mlbench_operator.kube import PAGE_SIZE

    kube = Kube(k8s.Configuration(), concurrency=1)
    paged = _Paged()
    monkeypatch.setattr(kube, "request", paged)
    try:
        if call == "list_objects":
            items, version = kube.list_objects("/api/v1/pods", "app=x", "pods")
            assert version == "77"
        else:
            items = getattr(kube, call)("ns", "app=x")
    finally:
        kube.close()
    assert [o["metadata"]["name"] for o in items] == [f"o{i}" for i in range(1200)]
    assert [q.get("continue") for q in paged.queries] == [None, "500", "1000"]
    assert {q["limit"] for q in paged.queries} == {str(PAGE_SIZE)}
    assert {q["labelSelector"] for q in paged.queries} == {"app=x"}
