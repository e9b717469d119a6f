"""Results integrity (issue 33): only the launcher the operator created gives results, the digest of its image and
of every kept file is recorded, a forged ``<run>-results`` is not taken for the run's, and the decompressed size
of a results bundle is capped by a setting. No cluster needed."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gzip
import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest

from mlbench_api import bundle, download
from mlbench_api.runstatus import LauncherRecord
from mlbench_operator import runcontext, runobjects, runpods
from mlbench_operator.env import SettingsError
from mlbench_operator.podview import PodView
from mlbench_operator.run import ownership, results
from mlbench_operator.settings import OperatorConfig, results_max_bytes
from tests import factories
from tests.operator import helpers as h
from tests.operator.test_handlers import FakeKube, _reconciler, _running, ours, results_line
from tests.operator.test_reconcile import T0, pod, step, terminated, workers

ISO = "%Y-%m-%dT%H:%M:%SZ"
DIGEST = "docker.io/mlbench/runner@sha256:" + "ab" * 32


def _finished(restarts: int = 0, record: dict[str, Any] | None = None) -> dict[str, Any]:
    """A finished run's status: WorkersReady went False when it ended at T0."""
    cond = {"type": "WorkersReady", "status": "False", "reason": "RunFinished", "lastTransitionTime": T0.strftime(ISO)}
    status: dict[str, Any] = {
        "phase": "Failed",
        "restarts": restarts,
        "completionTime": T0.strftime(ISO),
        "conditions": [cond],
    }
    return {**status, "launcher": record} if record else status


def _launcher(attempt: int, uid: str, created: str | None = None, image_id: str | None = None) -> PodView:
    _, ctx = _ctx()
    obj = runpods.launcher_pod(ctx, attempt)
    obj["metadata"] = {**obj["metadata"], "uid": uid, "creationTimestamp": created}
    term = {"exitCode": 0, "reason": "Completed"}
    status = [{"name": "launcher", "imageID": image_id, "state": {"terminated": term}}] if image_id else []
    return pod(obj, phase="Succeeded", ready=False, containerStatuses=status)


def _ctx() -> tuple[dict[str, Any], runcontext.RunContext]:
    from tests.operator.test_reconcile import admitted

    return admitted(h.run())


# -- which launcher's log holds the results ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "pod", "accepted"),
    [
        (_finished(0, {"uid": "u-op", "attempt": 0}), _launcher(0, "u-op"), True),
        (_finished(0, {"uid": "u-op", "attempt": 0}), _launcher(0, "u-forged"), False),
        # the record is of attempt 0; attempt 1 ended before its launcher: a pod labelled attempt 1 is a forgery
        (_finished(1, {"uid": "u-op", "attempt": 0}), _launcher(1, "u-forged"), False),
        # ... and the old attempt's launcher is not the run's outcome either
        (_finished(1, {"uid": "u-op", "attempt": 0}), _launcher(0, "u-op"), False),
        # no record (an older operator): one created before the run ended is judged as before, one after is not
        (_finished(0), _launcher(0, "u-any", (T0 - timedelta(seconds=5)).strftime(ISO)), True),
        (_finished(0), _launcher(0, "u-late", (T0 + timedelta(seconds=5)).strftime(ISO)), False),
    ],
)
def test_only_the_recorded_launcher_of_the_current_attempt_gives_results(
    status: dict[str, Any], pod: PodView, accepted: bool
) -> None:
    found = results.launcher([pod], "", status)
    assert (found is pod) if accepted else (found is None)


def test_a_forged_launcher_s_log_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt 1 ended before its launcher; a pod of the launcher's name labelled attempt 1, with the run's
    ownerReference and labels, finished with a results line: the operator gives up without reading it."""
    body, _ = _ctx()
    body = {**body, "status": _finished(1, {"uid": "u-op", "attempt": 0})}
    kube = FakeKube()
    kube.log = results_line(factories.summary()) + "\n"
    rec = _reconciler(body, kube, monkeypatch)
    decision = asyncio.run(rec.keep_results(T0, [_launcher(1, "u-forged")]))
    assert decision.action is results.Action.GIVE_UP
    assert not any(call[0] == "read_log" for call in kube.calls)
    assert not any(call[:2] == ("create", "ConfigMap") for call in kube.calls)


# -- the launcher's image digest --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("record", "pod", "image_id"),
    [
        (LauncherRecord(uid="u-op", attempt=0), None, None),
        (LauncherRecord(uid="u-op", attempt=0), _launcher(0, "u-op"), None),  # not started yet: no imageID
        (LauncherRecord(uid="u-op", attempt=0), _launcher(0, "u-forged", image_id=DIGEST), None),
        (LauncherRecord(uid="u-op", attempt=0), _launcher(0, "u-op", image_id=DIGEST), DIGEST),
        (LauncherRecord(uid="u-op", attempt=0, image_id="old"), _launcher(0, "u-op", image_id=DIGEST), DIGEST),
    ],
)
def test_launcher_record_takes_the_recorded_pod_s_image_digest(
    record: LauncherRecord | None, pod: PodView | None, image_id: str | None
) -> None:
    got = ownership.launcher_record(record, pod)
    assert (got.image_id if got is not None else None) == image_id
    if got is not None and record is not None:
        assert (got.uid, got.attempt) == (record.uid, record.attempt)


@pytest.mark.parametrize("record", [None, LauncherRecord(uid="u-old", attempt=0, image_id="old")])
def test_an_accepted_launcher_without_a_record_for_its_attempt_is_recorded(record: LauncherRecord | None) -> None:
    """The operator stopped between its create and the record (or an older operator ran the run): the launcher
    accepted by when it was created is recorded, so that after the run only a recorded launcher is the run's."""
    got = ownership.launcher_record(record, _launcher(1, "u-new", image_id=DIGEST))
    assert got == LauncherRecord(uid="u-new", attempt=1, image_id=DIGEST)


def test_the_plan_records_the_digest_the_launcher_ran() -> None:
    body, ctx, _ = _running("None")
    body = {**body, "status": {**body["status"], "launcher": {"uid": "u-op", "attempt": 0}}}
    obj = runpods.launcher_pod(ctx, 0)
    obj["metadata"] = {**obj["metadata"], "uid": "u-op"}
    running = pod(obj, containerStatuses=[{"name": "launcher", "imageID": DIGEST, "state": {"running": {}}}])
    _, plan = step(body, ctx, [*workers(ctx), running])
    assert plan.status["launcher"] == {"uid": "u-op", "attempt": 0, "imageId": DIGEST}


def test_a_new_launcher_record_clears_the_earlier_attempt_s_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The status is a merge patch: the record of a new launcher says imageId null, or the last attempt's digest
    would stay beside the new UID."""
    body, ctx, _ = _running("None")
    kube = FakeKube()
    rec = _reconciler(body, kube, monkeypatch)
    asyncio.run(rec.record_launcher([runpods.launcher_pod(ctx, 1)], ["uid-new"], 1))
    assert kube.patches()[-1]["launcher"] == {"uid": "uid-new", "attempt": 1, "imageId": None}


# -- the digests of the kept files ------------------------------------------------------------------------------------
def _bundle() -> bundle.Bundle:
    summary = factories.summary().model_dump_json(by_alias=True).encode()
    return bundle.fit({bundle.SUMMARY: summary, bundle.EVENTS: b"{}\n"})


def test_kept_status_records_each_file_s_sha256() -> None:
    found = _bundle()
    kept = results.kept_status("r1", found, T0)
    assert kept["sha256"] == {name: hashlib.sha256(data).hexdigest() for name, data in found.files.items()}
    assert set(kept["sha256"]) == {bundle.SUMMARY, bundle.EVENTS}


def _run_with(found: bundle.Bundle) -> dict[str, Any]:
    return {"status": {"phase": "Succeeded", "results": results.kept_status("r1", found, T0)}}


def _config_map_files(files: dict[str, bytes]) -> dict[str, str]:
    return {k + ".gz": base64.b64encode(gzip.compress(v, mtime=0)).decode() for k, v in files.items()}


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (lambda f: f, None),
        (lambda f: {**f, bundle.SUMMARY: f[bundle.SUMMARY].replace(b"true", b"false", 1)}, "summary.json: its SHA-256"),
        (lambda f: {k: v for k, v in f.items() if k != bundle.EVENTS}, "events.jsonl: recorded by the operator"),
        (lambda f: {**f, bundle.CONFIG: b"{}"}, "config.json: not a file the operator kept"),
    ],
)
def test_mlbench_results_refuses_files_the_operator_did_not_keep(edit: Any, error: str | None) -> None:
    found = _bundle()
    served = download.from_config_map(_config_map_files(edit(dict(found.files))))
    if error is None:
        assert download.verified(_run_with(found), served) is served
        return
    with pytest.raises(bundle.BundleError, match=error):
        download.verified(_run_with(found), served)


def test_results_kept_by_an_older_operator_are_read_as_they_are() -> None:
    found = _bundle()
    old = _run_with(found)
    del old["status"]["results"]["sha256"]
    assert download.verified(old, found) is found


def _forged_results(found: bundle.Bundle, uid: str) -> dict[str, Any]:
    obj = runobjects.results_config_map("r1", "default", uid, "t", found)
    return {**obj, "metadata": {**obj["metadata"], **ours(uid=uid)["metadata"]}}


@pytest.mark.parametrize(
    ("existing", "why"),
    [
        ({"binaryData": {"summary.json.gz": "AAAA"}}, None),
        ({"binaryData": {"summary.json.gz": "BBBB"}}, "its summary.json.gz is not the launcher's"),
        ({"binaryData": {"summary.json.gz": "AAAA", "x.gz": "AAAA"}}, "it holds files"),
        ({"binaryData": {"summary.json.gz": "AAAA"}, "data": {"a": "b"}}, "text data"),
        ({}, "it holds files [], the launcher printed"),
    ],
)
def test_results_differ(existing: dict[str, Any], why: str | None) -> None:
    got = ownership.results_differ(existing, {"binaryData": {"summary.json.gz": "AAAA"}})
    assert (got is None) if why is None else (got is not None and why in got), got


def test_a_forged_results_config_map_with_the_run_s_marks_is_a_name_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace editor creates ``<run>-results`` first, with the run's ownerReference and labels and files
    of their own: the operator does not record it as the run's results."""
    body, ctx, _ = _running("None")
    uid = body["metadata"]["uid"]
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    done = dataclasses.replace(done, owner_uid=uid)
    body = {**body, "status": {**body["status"], "phase": "Succeeded", "completionTime": T0.strftime(ISO)}}
    kube = FakeKube()
    kube.log = results_line(factories.summary()) + "\n"
    forged = bundle.fit({bundle.SUMMARY: factories.summary(goal_reached=False).model_dump_json(by_alias=True).encode()})
    kube.existing[("ConfigMap", "r1-results")] = _forged_results(forged, uid)
    rec = _reconciler(body, kube, monkeypatch)
    decision = asyncio.run(rec.keep_results(T0, [done]))
    assert decision.action is results.Action.GIVE_UP
    assert decision.message.startswith("NameConflict: ConfigMap r1-results")
    assert "is not the launcher's" in decision.message
    assert "configMap" not in rec.status["results"]


def test_the_operator_s_own_results_config_map_from_an_interrupted_pass_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body, ctx, _ = _running("None")
    uid = body["metadata"]["uid"]
    done = dataclasses.replace(
        terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message()), owner_uid=uid
    )
    body = {**body, "status": {**body["status"], "phase": "Succeeded", "completionTime": T0.strftime(ISO)}}
    kube = FakeKube()
    kube.log = results_line(factories.summary()) + "\n"
    rec = _reconciler(body, kube, monkeypatch)
    found, _ = results.from_log(kube.log)
    assert found is not None
    found = results.with_hardware(found, {})  # no node labels read (FakeKube serves no nodes)
    kube.existing[("ConfigMap", "r1-results")] = _forged_results(found, uid)  # what the interrupted pass wrote
    decision = asyncio.run(rec.keep_results(T0, [done]))
    assert decision.action is results.Action.NONE, decision.message
    assert rec.status["results"]["configMap"] == "r1-results"
    assert rec.status["results"]["sha256"] == bundle.digests(found)


# -- the decompressed size, a setting ---------------------------------------------------------------------------------
def test_results_max_bytes_setting() -> None:
    assert results_max_bytes({}) == bundle.MAX_TOTAL_BYTES == OperatorConfig().results_max_bytes
    assert results_max_bytes({"MLBENCH_RESULTS_MAX_BYTES": "1048576"}) == 1048576
    assert OperatorConfig.from_env({"MLBENCH_RESULTS_MAX_BYTES": "1048576"}).results_max_bytes == 1048576
    for bad in ("1k", "100", str(bundle.MAX_TOTAL_BYTES + 1)):
        with pytest.raises(SettingsError, match="MLBENCH_RESULTS_MAX_BYTES"):
            results_max_bytes({"MLBENCH_RESULTS_MAX_BYTES": bad})


def _bomb_line(size: int) -> str:
    """A results line whose one file is ``size`` zero bytes, gzip-compressed (about 1000:1)."""
    data = gzip.compress(b"\0" * size, mtime=0)
    files = {"summary.json.gz": base64.b64encode(data).decode()}
    return json.dumps({"event": bundle.EVENT, "schema": bundle.SCHEMA, "files": files})


def test_the_limit_is_the_setting_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 MiB bomb passes the default limit's count but not a 1 MiB setting: refused, nothing kept."""
    line = _bomb_line(2 * 1024 * 1024)
    assert len(line) < 16 * 1024
    found, why = results.from_log(line, 1024 * 1024)
    assert found is None
    assert "more than 1048576 bytes" in why
    body, ctx, _ = _running("None")
    uid = body["metadata"]["uid"]
    done = dataclasses.replace(terminated(runpods.launcher_pod(ctx, 0), 0), owner_uid=uid)
    body = {**body, "status": {**body["status"], "phase": "Succeeded", "completionTime": T0.strftime(ISO)}}
    kube = FakeKube()
    kube.log = line + "\n"
    rec = _reconciler(body, kube, monkeypatch, config=OperatorConfig(results_max_bytes=1024 * 1024))
    decision = asyncio.run(rec.keep_results(T0, [done]))
    assert decision.action is results.Action.GIVE_UP
    assert "more than 1048576 bytes" in decision.message
    assert not any(call[:2] == ("create", "ConfigMap") for call in kube.calls)
