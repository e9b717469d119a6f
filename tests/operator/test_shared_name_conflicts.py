"""A PVC or Job squatting on a name the operator uses for a run's dataset (issue 33): reported as ``NameConflict``
on DatasetReady, never used, replaced or retried in silence. The shared objects are owned by no run, so what marks
them the operator's is their labels and annotations, and a fetch Job's pod template (image, command, volumes:
:func:`ownership.shared_not_ours`). No cluster needed; the
same against the API server: tests/operator/test_cluster_datasets.py (cluster-marked)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from mlbench_api.contract import DatasetReason, Reason
from mlbench_operator import conditions as c
from mlbench_operator import fetchjob, runcontext
from mlbench_operator import naming as n
from mlbench_operator.datasets import FetchAction, name_conflict
from mlbench_operator.run import admission, lifecycle, ownership
from mlbench_operator.settings import DatasetSettings
from tests.operator import helpers as h
from tests.operator.test_handlers import FakeKube, _reconciler

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def _admitted() -> tuple[dict[str, Any], runcontext.RunContext]:
    body = h.run()
    result = admission.admit(body, h.sourced_task())
    assert not isinstance(result, admission.Rejection), result
    ctx, snapshot = result
    return {**body, "status": admission.admitted_status(body, ctx, snapshot, T0)}, ctx


def _pvc() -> dict[str, Any]:
    return fetchjob.dataset_pvc("default", DatasetSettings())


def _job() -> dict[str, Any]:
    return fetchjob.fetch_job(_admitted()[1], DatasetSettings())


def _with(obj: dict[str, Any], part: str, key: str, value: str | None) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    marks = out["metadata"].setdefault(part, {})
    if value is None:
        marks.pop(key, None)
    else:
        marks[key] = value
    return out


def _owned(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["ownerReferences"] = [{"kind": "CronJob", "name": "nightly", "uid": "u", "controller": True}]
    return out


def _changed(obj: dict[str, Any], change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    change(out)
    return out


def _container(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"]["containers"][0])


def _complete(job: dict[str, Any]) -> None:
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}


def _image(job: dict[str, Any]) -> None:
    _complete(job)
    job["spec"]["template"]["spec"]["containers"][0]["image"] = "x.example/f:1"


def _command(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["containers"][0]["command"] = ["sh", "-c", "cp e /data/x"]


def _mirror(job: dict[str, Any]) -> None:
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    command[command.index(fetchjob.URL_FLAG) + 1] = "https://mirror.example/cifar-10-python.tar.gz"


def _init_container(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["initContainers"] = [{**_container(job), "command": ["sh", "-c", "echo > m"]}]


def _env(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "http_proxy", "value": "http://evil:3128"}]


def _sidecar(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["containers"].append(_container(job))


def _host_path(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["volumes"] = [{"name": "data", "hostPath": {"path": "/"}}]


#: (the object found under the name, the operator's, what the refusal says; None: it is the operator's)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    ("pvc", _pvc(), _pvc(), None),
    ("pvc extra label", _with(_pvc(), "labels", "extra", "yes"), _pvc(), None),  # more marks than ours are fine
    ("pvc no managed-by", _with(_pvc(), "labels", n.LABEL_MANAGED_BY, None), _pvc(), f"it has no {n.LABEL_MANAGED_BY}"),
    ("pvc helm", _with(_pvc(), "labels", n.LABEL_MANAGED_BY, "helm"), _pvc(), "is 'helm', not 'mlbench-operator'"),
    ("pvc bare", {"metadata": {}}, _pvc(), "it has no"),
    ("job", _job(), _job(), None),
    ("job extra label, complete", _changed(_with(_job(), "labels", "x", "y"), _complete), _job(), None),
    ("job owned", _owned(_job()), _job(), "its controller is CronJob nightly"),
    ("job no labels", _changed(_job(), lambda j: j["metadata"].pop("labels")), _job(), f"no {n.LABEL_MANAGED_BY}"),
    ("job no annotations", _changed(_job(), lambda j: j["metadata"].pop("annotations")), _job(), "it has no"),
    ("job sha256", _with(_job(), "annotations", n.ANNOTATION_DATASET_SHA256, "0" * 64), _job(), "dataset-sha256 is"),
    ("job store", _with(_job(), "annotations", n.ANNOTATION_DATASET_STORE, "sha256-0"), _job(), "dataset-store is"),
    ("job no store", _with(_job(), "annotations", n.ANNOTATION_DATASET_STORE, None), _job(), "no mlbench.io/dataset-"),
    ("job managed-by", _with(_job(), "labels", n.LABEL_MANAGED_BY, "someone"), _job(), "managed-by is 'someone'"),
    ("job dataset", _with(_job(), "labels", n.LABEL_DATASET, "other"), _job(), f"{n.LABEL_DATASET} is 'other'"),
    ("job key", _with(_job(), "labels", n.LABEL_DATASET_KEY, "0" * 10), _job(), f"{n.LABEL_DATASET_KEY} is '0000"),
    ("job image, complete", _changed(_job(), _image), _job(), "another image or command"),
    ("job command", _changed(_job(), _command), _job(), "another image or command"),
    ("job sidecar", _changed(_job(), _sidecar), _job(), "another image or command"),
    ("job mirror", _changed(_job(), _mirror), _job(), None),  # the same bytes from another URL: the same fetch
    ("job init container", _changed(_job(), _init_container), _job(), "another image or command"),
    ("job env", _changed(_job(), _env), _job(), "another image or command"),
    ("job volumes", _changed(_job(), _host_path), _job(), "other volumes"),
]


@pytest.mark.parametrize(("what", "existing", "wanted", "why"), CASES, ids=[case[0] for case in CASES])
def test_shared_not_ours(what: str, existing: dict[str, Any], wanted: dict[str, Any], why: str | None) -> None:
    got = ownership.shared_not_ours(existing, wanted)
    assert (got is None) if why is None else (got is not None and why in got), (what, got)


def test_the_reason_is_the_api_s_name_conflict() -> None:
    assert DatasetReason.NAME_CONFLICT.value == Reason.NAME_CONFLICT.value == "NameConflict"
    state = name_conflict("Job j already exists ...")
    assert state.action is FetchAction.WAIT
    plan = lifecycle.dataset_plan(_admitted()[0], state, T0)
    found = c.get(plan.status["conditions"], c.DATASET_READY)
    assert found is not None
    assert (found["status"], found["reason"]) == ("False", "NameConflict")
    assert plan.events == [("Warning", "NameConflict", "Job j already exists ...")]
    assert plan.status["phase"] == "Pending"  # waits for the name to be freed; never fails the run


class _Kube(FakeKube):
    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list_pods", selector))
        return []

    def delete_job(self, namespace: str, name: str) -> None:
        self.calls.append(("delete_job", name))


def _ensure(kube: _Kube, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, float | None]:
    body, ctx = _admitted()
    rec = _reconciler(body, kube, monkeypatch)
    return rec, asyncio.run(rec.ensure_dataset(ctx, T0, []))


def _dataset_ready(rec: Any) -> dict[str, Any]:
    found = c.get(rec.status["conditions"], c.DATASET_READY)
    assert found is not None
    return dict(found)


def test_a_squatted_dataset_volume_is_a_name_conflict_and_no_fetch_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = _Kube()
    pvc = _pvc()
    kube.existing[("PersistentVolumeClaim", pvc["metadata"]["name"])] = _with(pvc, "labels", n.LABEL_MANAGED_BY, None)
    rec, wait = _ensure(kube, monkeypatch)
    ready = _dataset_ready(rec)
    assert ready["reason"] == "NameConflict"
    assert ready["message"].startswith("PersistentVolumeClaim mlbench-datasets already exists and was not created")
    assert wait is not None
    assert wait > 0  # looked at again
    assert not rec.pvc_ensured  # and checked again next time, not taken as ensured
    assert not any(call[:2] == ("create", "Job") for call in kube.calls)
    assert ("Warning", "NameConflict", ready["message"]) in rec.events


def test_a_squatted_fetch_job_is_a_name_conflict_never_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Job of the fetch Job's name without the operator's marks, Failed before the run was admitted: an own Job
    would be replaced; this one is neither deleted, nor read for its pods' termination messages, nor trusted."""
    kube = _Kube()
    job = _with(_job(), "annotations", n.ANNOTATION_DATASET_SHA256, None)
    job["status"] = {"conditions": [{"type": "Failed", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
    kube.existing[("Job", job["metadata"]["name"])] = job
    rec, _ = _ensure(kube, monkeypatch)
    ready = _dataset_ready(rec)
    assert ready["reason"] == "NameConflict"
    assert f"Job {job['metadata']['name']} already exists" in ready["message"]
    assert n.ANNOTATION_DATASET_SHA256 in ready["message"]
    assert not any(call[0] in ("delete_job", "list_pods") for call in kube.calls)
    assert not any(call[:2] == ("create", "Job") for call in kube.calls)


@pytest.mark.parametrize(
    "change",
    [lambda j: j["metadata"]["labels"].pop(n.LABEL_MANAGED_BY), _image],
    ids=["without the operator's label", "the operator's marks, another image"],
)
def test_a_complete_squatted_fetch_job_is_not_taken_for_fetched_data(
    change: Callable[[dict[str, Any]], object], monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = _Kube()
    job = _changed(_job(), change)
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    kube.existing[("Job", job["metadata"]["name"])] = job
    rec, wait = _ensure(kube, monkeypatch)
    assert wait is not None  # not ready: the workers wait
    assert _dataset_ready(rec)["reason"] == "NameConflict"
    assert not any(call[0] in ("delete_job", "list_pods") for call in kube.calls)  # reported, never replaced


def test_the_operator_s_own_volume_and_job_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = _Kube()
    pvc, job = _pvc(), _job()
    kube.existing[("PersistentVolumeClaim", pvc["metadata"]["name"])] = pvc
    kube.existing[("Job", job["metadata"]["name"])] = {
        **job,
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    rec, wait = _ensure(kube, monkeypatch)
    assert wait is None  # the data is ready: the pass goes on to the workers
    assert _dataset_ready(rec)["reason"] == "Fetched"
    assert rec.pvc_ensured
