"""The translation and language-modelling kinds in real pods: a smoke task of each trains across the test nodes
through mpirun over ssh, and what a user reads (``kubectl get br``'s SCORE, ``status.result``) is in the task's
own metric: BLEU with sacrebleu's signature, perplexity.

Both train on data the runner generates (the synthetic language pair, the synthetic corpus in WikiText's token
format): NOT WMT, NOT WikiText-2, and the figures printed are not results. Their goals are lowered so that a run
ends within a few epochs on the nodes' shared 2 cores; the goal's arithmetic has its own tests.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import yaml

from mlbench_api import display
from mlbench_api.goal import GoalMetric
from tests.e2e.conftest import E2E, E2E_LABEL, REPO, SESSION

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.e2e, pytest.mark.slow]


class Smoke(NamedTuple):
    catalog: str  #: manifests/catalog/<catalog>.yaml
    metric: GoalMetric
    goal: dict[str, float]  #: the lowered goal
    max_epochs: int


SMOKES = [
    Smoke("synthetic-transformer-smoke", GoalMetric.BLEU, {"target": 5.0, "lightTarget": 2.0}, 6),
    Smoke("synthetic-awd-lstm-smoke", GoalMetric.PERPLEXITY, {"target": 30.0, "lightTarget": 40.0}, 6),
]


def _task(e2e: E2E, smoke: Smoke) -> str:
    body = yaml.safe_load((REPO / "manifests" / "catalog" / f"{smoke.catalog}.yaml").read_text())
    spec: dict[str, Any] = body["spec"]
    spec["description"] = f"e2e test task (NOT a result): {smoke.catalog} with its goal lowered"
    spec["goal"].update(smoke.goal)
    spec["training"]["maxEpochs"] = smoke.max_epochs
    name = f"e2e-{SESSION}-{smoke.catalog.removeprefix('synthetic-')}"
    e2e.apply({**body, "metadata": {"name": name, "labels": E2E_LABEL}})
    e2e.tasks.append(name)
    return name


@pytest.mark.parametrize("smoke", SMOKES, ids=lambda s: s.metric.value)
def test_a_smoke_task_trains_in_pods_and_reports_its_own_metric(e2e: E2E, smoke: Smoke) -> None:
    task = _task(e2e, smoke)
    run = e2e.run(f"smoke-{smoke.metric.value}", task, scheduling={**e2e.scheduling, "placement": "OneWorkerPerNode"})
    scores: list[str] = []

    def every() -> None:
        row = e2e.get_br(run)
        if row.get("PHASE") == "Running" and row.get("SCORE") not in (None, "", "<none>"):
            scores.append(row["SCORE"])

    st = e2e.wait_finished(run, timeout=900, every=every)
    assert st.get("phase") == "Succeeded", f"{run}: {st}\n{e2e.debug(run)}"
    result = st["result"]
    print(f"\n{run}: {e2e.get_br(run)}\nresult: {result}")
    assert result["goalReached"], result
    assert result["goalMetric"] == smoke.metric.value
    assert result["worldSize"] == 2
    final = result["finalScore"]
    assert final is not None
    assert result["bestScore"] == (min if smoke.metric is GoalMetric.PERPLEXITY else max)(result["bestScore"], final)
    if smoke.metric is GoalMetric.BLEU:
        assert result["bleuSignature"].startswith("nrefs:1|"), result
    else:
        assert "bleuSignature" not in result
    # the column a person reads is the metric's own form, the exact figure beside it
    assert st["progress"]["lastScore"] == final
    assert e2e.get_br(run)["SCORE"] == display.score(smoke.metric, final)
    suffix = " BLEU" if smoke.metric is GoalMetric.BLEU else ""
    prefix = "ppl " if smoke.metric is GoalMetric.PERPLEXITY else ""
    assert all(s.endswith(suffix) and s.startswith(prefix) for s in scores), scores
