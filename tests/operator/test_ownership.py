"""Whose is an object holding a name the operator uses for a run (the NameConflict decision; no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from mlbench_operator import naming as n
from mlbench_operator.run.ownership import conflict_text, not_ours

RUN, UID = "r1", "uid-r1"
OWNER = {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkRun", "name": RUN, "uid": UID, "controller": True}
LABELS = {n.LABEL_RUN: RUN, n.LABEL_MANAGED_BY: n.MANAGER}


def obj(refs: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "ownerReferences": [OWNER] if refs is None else refs,
            "labels": LABELS if labels is None else labels,
        }
    }


@pytest.mark.parametrize(
    ("existing", "why"),
    [
        (obj(), None),  # the operator's own, from an interrupted pass
        (obj(labels={**LABELS, "extra": "x"}), None),
        (obj(refs=[{**OWNER, "controller": False}, {**OWNER, "uid": UID}]), None),  # the controller ref counts
        ({"metadata": {}}, "it has no controller"),  # a pod a user created by hand
        (obj(refs=[{**OWNER, "controller": False}]), "it has no controller"),
        (obj(refs=[{**OWNER, "uid": "uid-old"}]), "its controller is BenchmarkRun r1 (uid uid-old)"),  # deleted run
        (obj(refs=[{**OWNER, "kind": "Job", "name": "j"}]), "its controller is Job j (uid uid-r1)"),  # right uid
        (obj(refs=[{"controller": True}]), "its controller is ? ? (uid none)"),
        (obj(labels={n.LABEL_RUN: RUN}), f"its label {n.LABEL_MANAGED_BY} is not {n.MANAGER}"),
        (obj(labels={**LABELS, n.LABEL_MANAGED_BY: "helm"}), f"its label {n.LABEL_MANAGED_BY} is not {n.MANAGER}"),
        (obj(labels={**LABELS, n.LABEL_RUN: "r2"}), f"its label {n.LABEL_RUN} is not r1"),
        (obj(labels={n.LABEL_MANAGED_BY: n.MANAGER}), f"its label {n.LABEL_RUN} is not r1"),
    ],
)
def test_only_the_operators_object_for_this_run_is_ours(existing: dict[str, Any], why: str | None) -> None:
    assert not_ours(existing, RUN, UID) == why


def test_the_conflict_names_the_object_and_the_rule() -> None:
    text = conflict_text("Secret", "r1-ssh", "it has no controller")
    assert text == (
        "Secret r1-ssh already exists and was not created by the operator for this run (it has no controller); "
        "waiting for it to be deleted"
    )
