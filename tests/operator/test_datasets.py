"""Datasets, pure: the fetch Job and PVC builders, the (job, pods) -> state decision, the status it gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mlbench_api.datasets import FetchExit, FetchFailure, FetchReason
from mlbench_operator import conditions as c
from mlbench_operator import fetchjob, runpods
from mlbench_operator import naming as n
from mlbench_operator.datasets import FetchAction, FetchState, fetch_state
from mlbench_operator.env import SettingsError
from mlbench_operator.policy import DEFAULT_IMAGE_REPO, DEFAULT_RUNNER_IMAGE
from mlbench_operator.run import admission, lifecycle
from mlbench_operator.runcontext import RunContext
from mlbench_operator.settings import DatasetSettings
from tests.operator import helpers as h

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
JOB = "mlbench-dataset-cifar10-jpeg-0123456789"
IMAGE = DatasetSettings().fetch_image


def ctx_for(task: dict[str, Any] | None = None, **kwargs: Any) -> RunContext:
    result = admission.admit(h.run(**kwargs), task or h.sourced_task(), dataset_claim="team-data")
    assert not isinstance(result, admission.Rejection), result
    return result[0]


def ts(t: datetime) -> str:
    return c.timestamp(t)


def job(
    *conds: tuple[str, datetime], failed: int = 0, deleting: bool = False, reason: str = "BackoffLimitExceeded"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": JOB}
    if deleting:
        meta["deletionTimestamp"] = ts(T0)
    return {
        "metadata": meta,
        "status": {
            "failed": failed,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": ts(at), "reason": reason} for t, at in conds
            ],
        },
    }


def pod(
    name: str, at: datetime, phase: str = "Failed", message: str | None = None, code: int = 1, **status: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "creationTimestamp": ts(at)},
        "status": {"phase": phase, **status},
    }
    if phase == "Failed":
        term = {"exitCode": code, "reason": "Error", **({"message": message} if message is not None else {})}
        body["status"]["containerStatuses"] = [{"name": "fetch", "state": {"terminated": term}}]
    return body


def failure(reason: FetchReason, message: str) -> str:
    return FetchFailure(reason, message).termination_message()


MISMATCH = failure(FetchReason.CHECKSUM_MISMATCH, "sha256 of http://x/y (5 bytes): expected aa, got bb")
REFUSED = failure(FetchReason.SOURCE_UNREACHABLE, "GET http://x/y: connection refused")


def test_the_operator_never_copies_a_urls_secrets_into_the_status() -> None:
    """An older fetcher's unredacted termination message, and a foreign (non-JSON) one."""
    said = "GET https://user:hunter2@h/c.tgz?sig=s3cr3t: HTTP 404 Not Found"
    raw = '{"reason": "SourceUnreachable", "message": "' + said + '"}'
    for message in (raw, said):
        state = fetch_state(
            JOB, job(("Failed", T0 + timedelta(seconds=30))), [pod("p1", T0, message=message)], T0, "pvc"
        )
        assert state.action is FetchAction.FAIL
        assert "https://h/c.tgz?…" in state.message
        assert "hunter2" not in state.message
        assert "s3cr3t" not in state.message


# -- the decision --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("job_", "pods", "action", "reason", "needle"),
    [
        (None, [], FetchAction.CREATE, "Fetching", f"creating the fetch Job {JOB}"),
        (job(deleting=True), [], FetchAction.WAIT, "Fetching", "to be deleted"),
        (job(("Complete", T0)), [], FetchAction.READY, "Fetched", f"into volume pvc by Job {JOB}"),
        (job(), [pod("p1", T0, "Running")], FetchAction.WAIT, "Fetching", f"fetch Job {JOB} is running"),
        (
            job(failed=1),
            [pod("p1", T0, message=REFUSED, code=10), pod("p2", T0 + timedelta(seconds=5), "Running")],
            FetchAction.WAIT,
            "Fetching",
            "(retry 1; last attempt: SourceUnreachable: GET http://x/y: connection refused)",
        ),
        (
            job(),
            [
                pod(
                    "p1",
                    T0,
                    "Pending",
                    conditions=[{"type": "PodScheduled", "status": "False", "message": "unbound PVC mlbench-datasets"}],
                )
            ],
            FetchAction.WAIT,
            "Fetching",
            "pod p1 cannot be scheduled: unbound PVC mlbench-datasets",
        ),
        (job(), [], FetchAction.WAIT, "Fetching", "no pod yet"),
        (
            job(("Failed", T0 + timedelta(seconds=30))),
            [pod("p1", T0, message=MISMATCH, code=11)],
            FetchAction.FAIL,
            "ChecksumMismatch",
            "expected aa, got bb",
        ),
        (
            job(("Failed", T0 + timedelta(seconds=30)), failed=3),
            [
                pod("old", T0, message=failure(FetchReason.FETCH_FAILED, "older")),
                pod("new", T0 + timedelta(seconds=20), message=REFUSED),
            ],
            FetchAction.FAIL,
            "SourceUnreachable",
            "connection refused",
        ),
        (
            job(("Failed", T0 + timedelta(seconds=30))),
            [pod("p1", T0, message="exec: mlbench-runner: not found", code=127)],
            FetchAction.FAIL,
            "DatasetFetchFailed",
            "pod p1 exited with code 127: exec: mlbench-runner: not found",
        ),
        (
            job(("Failed", T0 + timedelta(seconds=30))),
            [],
            FetchAction.FAIL,
            "DatasetFetchFailed",
            f"fetch Job {JOB} failed (BackoffLimitExceeded)",
        ),
        (  # the newest attempt was killed (no message): an older attempt's cause is not shown as its
            job(failed=2),
            [
                pod("p1", T0, message=REFUSED, code=10),
                pod("p2", T0 + timedelta(seconds=5), code=137),
                pod("p3", T0 + timedelta(seconds=9), "Running"),
            ],
            FetchAction.WAIT,
            "Fetching",
            f"fetch Job {JOB} is running (retry 2)",
        ),
        (  # the Job's deadline stopped it: that is the cause, not the older attempt's refusal
            job(("Failed", T0 + timedelta(seconds=30)), reason="DeadlineExceeded"),
            [pod("p1", T0, message=REFUSED, code=10), pod("p2", T0 + timedelta(seconds=5), code=137)],
            FetchAction.FAIL,
            "DatasetFetchFailed",
            f"fetch Job {JOB} failed (DeadlineExceeded: its activeDeadlineSeconds passed)",
        ),
        (  # ... also when the attempt it stopped said why it ended (a signal)
            job(("Failed", T0 + timedelta(seconds=30)), reason="DeadlineExceeded"),
            [pod("p1", T0, message=failure(FetchReason.FETCH_FAILED, "stopped by a signal"), code=1)],
            FetchAction.FAIL,
            "DatasetFetchFailed",
            "activeDeadlineSeconds passed); last attempt: DatasetFetchFailed: stopped by a signal",
        ),
        (  # failed before this run was admitted: history, replaced (the namespace is not wedged)
            job(("Failed", T0 - timedelta(seconds=1))),
            [pod("p1", T0 - timedelta(seconds=9), message=MISMATCH)],
            FetchAction.REPLACE,
            "Fetching",
            "failed before this run started (ChecksumMismatch: sha256 of http://x/y",
        ),
    ],
)
def test_fetch_state(
    job_: dict[str, Any] | None, pods: list[dict[str, Any]], action: FetchAction, reason: str, needle: str
) -> None:
    state = fetch_state(JOB, job_, pods, admitted_at=T0, volume="pvc")
    assert state.action is action
    assert state.reason.value == reason
    assert needle in state.message


def test_a_failure_at_the_admission_second_counts_for_the_run() -> None:
    state = fetch_state(JOB, job(("Failed", T0)), [pod("p", T0, message=MISMATCH)], admitted_at=T0, volume="v")
    assert state.action is FetchAction.FAIL


# -- the status it gives -----------------------------------------------------------------------------------------
def admitted(ctx: RunContext, **spec: Any) -> dict[str, Any]:
    body = h.run(**spec)
    body["status"] = admission.admitted_status(body, ctx, {}, T0)
    return body


def test_fetching_then_ready_with_an_event_only_when_the_condition_changes() -> None:
    ctx = ctx_for()
    body = admitted(ctx)
    plan = lifecycle.dataset_plan(body, FetchState(FetchAction.CREATE, c.DatasetReason.FETCHING, "creating"), T0)
    cond = c.get(plan.status["conditions"], c.DATASET_READY)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "Fetching")
    assert plan.status["phase"] == "Pending"
    wr = c.get(plan.status["conditions"], c.WORKERS_READY)
    assert wr is not None
    assert wr["reason"] == c.WAITING_FOR_DATASET
    assert plan.events == [("Normal", "Fetching", "creating")]
    assert plan.status["conditions"][0]["type"] == c.DATASET_READY  # first in kubectl describe

    body["status"] = plan.status
    again = lifecycle.dataset_plan(body, FetchState(FetchAction.WAIT, c.DatasetReason.FETCHING, "retry 1"), T0)
    assert again.events == []
    assert again.status["message"] == "retry 1"

    body["status"] = again.status
    done = lifecycle.dataset_plan(body, FetchState(FetchAction.READY, c.DatasetReason.FETCHED, "fetched"), T0)
    assert c.is_true(done.status["conditions"], c.DATASET_READY)
    assert done.events == [("Normal", "Fetched", "fetched")]
    assert not done.terminal


def test_a_failed_fetch_fails_the_run_with_its_reason() -> None:
    ctx = ctx_for()
    body = admitted(ctx)
    state = FetchState(FetchAction.FAIL, c.DatasetReason.CHECKSUM_MISMATCH, "expected aa, got bb")
    plan = lifecycle.dataset_plan(body, state, T0)
    assert plan.terminal
    assert plan.status["phase"] == "Failed"
    failed = c.get(plan.status["conditions"], c.FAILED)
    assert failed is not None
    assert (failed["status"], failed["reason"], failed["message"]) == (
        "True",
        "ChecksumMismatch",
        "expected aa, got bb",
    )
    assert plan.events == [("Warning", "ChecksumMismatch", "expected aa, got bb")]


def test_the_run_deadline_counts_while_fetching() -> None:
    ctx = ctx_for(runPolicy={"activeDeadlineSeconds": 60})
    body = admitted(ctx, runPolicy={"activeDeadlineSeconds": 60})
    waiting = FetchState(FetchAction.WAIT, c.DatasetReason.FETCHING, "fetch Job j is running")
    assert lifecycle.dataset_plan(body, waiting, T0 + timedelta(seconds=10)).requeue_after == 50
    late = lifecycle.dataset_plan(body, waiting, T0 + timedelta(seconds=61))
    assert late.terminal
    assert "activeDeadlineSeconds=60 while fetch Job j is running" in late.status["message"]


# -- builders ----------------------------------------------------------------------------------------------------
def test_fetch_job() -> None:
    ctx = ctx_for(namespace="team-a")
    settings = DatasetSettings(volume_name="team-data", backoff_limit=2, job_ttl_seconds=600)
    job_ = fetchjob.fetch_job(ctx, settings)
    assert job_["metadata"]["name"] == fetchjob.fetch_job_name(ctx.task.dataset, settings.fetch_image)
    assert job_["metadata"]["name"].startswith("mlbench-dataset-cifar10-jpeg-")
    assert job_["metadata"]["namespace"] == "team-a"
    assert "ownerReferences" not in job_["metadata"]  # shared by every run that needs the data
    assert job_["metadata"]["annotations"][n.ANNOTATION_DATASET_SHA256] == h.JPEG_SHA256
    spec = job_["spec"]
    assert (spec["backoffLimit"], spec["ttlSecondsAfterFinished"]) == (2, 600)
    fail_job = spec["podFailurePolicy"]["rules"][0]
    assert fail_job["action"] == "FailJob"
    assert fail_job["onExitCodes"]["values"] == [FetchExit.CHECKSUM_MISMATCH, FetchExit.VOLUME_FULL]
    pod_spec = spec["template"]["spec"]
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "team-data"}}]
    (container,) = pod_spec["containers"]
    assert container["command"] == [
        "mlbench-runner",
        "fetch-dataset",
        "--url",
        "http://datasets.example/cifar10-jpeg.tar.gz",
        "--sha256",
        h.JPEG_SHA256,
        "--dest",
        f"/data/sha256-{h.JPEG_SHA256}",  # content-addressed: the task's path is only where workers see it
        "--volume",
        "team-data",
    ]
    assert container["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]  # read-write, only here


def test_unpack_adds_its_flags_and_changes_the_job() -> None:
    task = h.sourced_task()
    plain = fetchjob.fetch_job_name(ctx_for(task).task.dataset, IMAGE)
    task["spec"]["dataset"]["source"].update(unpack=True, stripComponents=1)
    ctx = ctx_for(task)
    cmd = fetchjob.fetch_command(ctx.task.dataset, "v")
    assert cmd[-5:] == ["--unpack", "--strip-components", "1", "--volume", "v"]
    assert cmd[cmd.index("--dest") + 1] == f"/data/sha256-{h.JPEG_SHA256}-x1"  # another layout, another entry
    assert fetchjob.fetch_job_name(ctx.task.dataset, IMAGE) != plain  # other bytes on the volume: another Job


def test_a_mirror_shares_the_job() -> None:
    one = ctx_for(h.sourced_task(url="http://a.example/x.tgz"))
    two = ctx_for(h.sourced_task(url="https://mirror.example/y.tgz"))
    assert fetchjob.fetch_job_name(one.task.dataset, IMAGE) == fetchjob.fetch_job_name(two.task.dataset, IMAGE)


def test_job_names_fit_a_label_value() -> None:
    assert len(n.dataset_job_name("X" * 63, "0123456789")) <= 63
    assert n.dataset_job_name("CIFAR_10 (python)", "0123456789") == "mlbench-dataset-cifar-10-python-0123456789"


def test_workers_mount_the_dataset_volume_read_only() -> None:
    ctx = ctx_for()
    pod_ = runpods.worker_pod(ctx, 0, 0)
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "team-data", "readOnly": True}} in pod_["spec"][
        "volumes"
    ]
    mounts = pod_["spec"]["containers"][0]["volumeMounts"]
    data = [m for m in mounts if m["name"] == "data"]
    entry = f"sha256-{h.JPEG_SHA256}"
    assert data == [  # only its own store entry and marker, read-only, where the task reads them; never all of /data
        {"name": "data", "mountPath": "/data/cifar10/cifar10-jpeg.tar.gz", "subPath": entry, "readOnly": True},
        {
            "name": "data",
            "mountPath": "/data/cifar10/cifar10-jpeg.tar.gz.mlbench-dataset.json",
            "subPath": entry + ".mlbench-dataset.json",
            "readOnly": True,
        },
    ]
    launcher = runpods.launcher_pod(ctx, 0)
    assert all(m["name"] != "data" for m in launcher["spec"]["containers"][0]["volumeMounts"])


def test_dataset_pvc() -> None:
    pvc = fetchjob.dataset_pvc("team-a", DatasetSettings())
    assert pvc["metadata"]["name"] == "mlbench-datasets"
    assert "ownerReferences" not in pvc["metadata"]
    assert pvc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mlbench-operator"
    assert pvc["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}}
    rwx = fetchjob.dataset_pvc("team-a", DatasetSettings(storage_class="nfs", access_mode="ReadWriteMany"))
    assert rwx["spec"]["storageClassName"] == "nfs"
    assert rwx["spec"]["accessModes"] == ["ReadWriteMany"]


# -- settings ----------------------------------------------------------------------------------------------------
def test_settings_from_env() -> None:
    assert DatasetSettings.from_env({}) == DatasetSettings()
    s = DatasetSettings.from_env(
        {
            "MLBENCH_DATASET_STORAGE_CLASS": "fast",
            "MLBENCH_DATASET_VOLUME_SIZE": "500Gi",
            "MLBENCH_DATASET_ACCESS_MODE": "ReadWriteMany",
            "MLBENCH_DATASET_VOLUME": "shared-data",
            "MLBENCH_DATASET_BACKOFF_LIMIT": "0",
        }
    )
    assert (s.storage_class, s.size, s.access_mode, s.volume_name, s.backoff_limit) == (
        "fast",
        "500Gi",
        "ReadWriteMany",
        "shared-data",
        0,
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"MLBENCH_DATASET_ACCESS_MODE": "ReadWriteMani"}, "MLBENCH_DATASET_ACCESS_MODE='ReadWriteMani'"),
        ({"MLBENCH_DATASET_VOLUME_SIZE": "lots"}, "MLBENCH_DATASET_VOLUME_SIZE='lots'"),
        ({"MLBENCH_DATASET_VOLUME": "Bad_Name"}, "MLBENCH_DATASET_VOLUME='Bad_Name'"),
        ({"MLBENCH_DATASET_JOB_TTL_SECONDS": "0"}, "MLBENCH_DATASET_JOB_TTL_SECONDS='0' must be at least 1"),
        ({"MLBENCH_DATASET_FETCH_DEADLINE_SECONDS": "soon"}, "is not an integer"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=None) as info:
        DatasetSettings.from_env(env)
    assert needle in str(info.value)


def test_refused_creates() -> None:
    from mlbench_operator.datasets import refused

    quota = refused(403, 'persistentvolumeclaims "mlbench-datasets" is forbidden: exceeded quota', "v", JOB)
    assert (quota.action, quota.reason.value) == (FetchAction.WAIT, "Fetching")
    assert "(HTTP 403): persistentvolumeclaims" in quota.message
    invalid = refused(422, "spec.storageClassName: Invalid value", "v", JOB)
    assert (invalid.action, invalid.reason.value) == (FetchAction.FAIL, "DatasetFetchFailed")


# -- content-addressed store, pinned image, trusted Jobs (issue 33, data integrity) -----------------------------
def test_a_run_of_another_path_shares_the_store_entry_and_the_job() -> None:
    """The path is only where the workers see the data: an open-division run that names the closed task's path
    (or any other) writes nothing there; the fetch goes to the entry named by the checksum."""
    task = h.sourced_task()
    closed = ctx_for(task)
    task["spec"]["dataset"]["path"] = "/data/elsewhere/x.tgz"
    other = ctx_for(task)
    assert fetchjob.fetch_command(closed.task.dataset, "v") == fetchjob.fetch_command(other.task.dataset, "v")
    assert fetchjob.fetch_job_name(closed.task.dataset, IMAGE) == fetchjob.fetch_job_name(other.task.dataset, IMAGE)
    forged = h.sourced_task()
    forged["spec"]["dataset"]["source"]["sha256"] = "f" * 64
    theirs = fetchjob.fetch_command(ctx_for(forged).task.dataset, "v")
    assert theirs[theirs.index("--dest") + 1] == "/data/sha256-" + "f" * 64  # other bytes, never the closed entry


def test_the_fetch_job_runs_the_pinned_image_not_the_runs() -> None:
    ctx = ctx_for(image=f"{DEFAULT_IMAGE_REPO}/mlbench-runner:the-authors-own")
    settings = DatasetSettings(fetch_image="registry.example/mlbench-runner@sha256:" + "a" * 64)
    job_ = fetchjob.fetch_job(ctx, settings)
    (container,) = job_["spec"]["template"]["spec"]["containers"]
    assert ctx.image == f"{DEFAULT_IMAGE_REPO}/mlbench-runner:the-authors-own"
    assert container["image"] == settings.fetch_image
    # another pinned image is another Job: never one an older operator (or another image) made
    assert job_["metadata"]["name"] != fetchjob.fetch_job(ctx, DatasetSettings())["metadata"]["name"]


@pytest.mark.parametrize(
    ("env", "image"),
    [
        ({}, DEFAULT_RUNNER_IMAGE),
        ({"MLBENCH_RUNNER_IMAGE": "r.example/runner:2"}, "r.example/runner:2"),
        (
            {"MLBENCH_RUNNER_IMAGE": "r.example/runner:2", "MLBENCH_FETCH_IMAGE": "r.example/fetch:1"},
            "r.example/fetch:1",
        ),
    ],
)
def test_fetch_image_setting(env: dict[str, str], image: str) -> None:
    assert DatasetSettings.from_env(env).fetch_image == image


def test_a_fetch_image_pattern_is_refused_naming_the_variable() -> None:
    with pytest.raises(SettingsError, match="MLBENCH_FETCH_IMAGE: expected an image reference"):
        DatasetSettings.from_env({"MLBENCH_FETCH_IMAGE": "r.example/*"})


@pytest.mark.parametrize(
    "path",
    [
        f"/data/sha256-{h.JPEG_SHA256}",  # the closed task's store entry
        f"/data/sha256-{h.JPEG_SHA256}.mlbench-dataset.json",  # its marker
        "/data/cifar10/cifar10-jpeg.tar.gz.mlbench-dataset.json",  # a marker of the old path-named layout
        "/data/x/sha256-abc/y",
    ],
)
def test_an_override_naming_the_store_or_a_marker_is_rejected_naming_the_field(path: str) -> None:
    result = admission.admit(h.run(overrides={"dataset": path}), h.sourced_task())
    assert isinstance(result, admission.Rejection)
    assert result.reason == c.Reason.INVALID_CONFIG
    assert "spec.overrides.dataset: " in result.message
    assert "store" in result.message or "marker" in result.message


def test_an_ordinary_override_path_is_admitted() -> None:
    assert not isinstance(
        admission.admit(h.run(overrides={"dataset": "/data/mine/c.tgz"}), h.sourced_task()), admission.Rejection
    )


def test_a_task_naming_the_store_is_invalid() -> None:
    task = h.sourced_task()
    task["spec"]["dataset"]["path"] = f"/data/sha256-{h.JPEG_SHA256}"
    result = admission.admit(h.run(), task)
    assert isinstance(result, admission.Rejection)
    assert result.reason == c.Reason.INVALID_TASK
    assert "path: /data/sha256-" in result.message
