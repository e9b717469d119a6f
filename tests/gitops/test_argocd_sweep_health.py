"""Argo CD's health check for BenchmarkSweep, run by a real Lua interpreter over statuses the operator's own
planner (``mlbench_operator.sweep_plan.decide``) writes: the check cannot drift from the status it reads.

Without a check a kind is Healthy as soon as it exists, also a sweep stopped by ``failurePolicy: Stop``.
"""

from __future__ import annotations

from typing import Any

import pytest

from mlbench_operator.sweep import plan as sweep_plan
from mlbench_operator.sweep.plan import Observed, Problem, SweepReason
from tests.gitops.lua import Health, run_health
from tests.gitops.test_manifests import SWEEP_SCRIPT
from tests.operator.test_sweeps import ALL, T0, W1S1, sweep


def _planned(
    body: dict[str, Any], phases: dict[str, str], problems: dict[str, Problem] | None = None
) -> dict[str, Any]:
    """The sweep with the status the planner writes when its runs exist in ``phases``."""
    observed = {name: Observed(name, phase) for name, phase in phases.items()}
    status = sweep_plan.decide(body, observed, T0, problems).status
    return {**body, "status": status}


def _after(body: dict[str, Any], phases: dict[str, str]) -> dict[str, Any]:
    """A second pass over the same runs (the first recorded them), as the sweep's daemon goes on."""
    return _planned(_planned(body, phases), phases)


CASES = [
    pytest.param(sweep(), Health("Progressing", "Waiting for the operator: the sweep has no status yet"), id="new"),
    pytest.param(
        {**_planned(sweep(), {}), "metadata": {**sweep()["metadata"], "generation": 2}},
        Health("Progressing", "Waiting for the operator: generation 2 not observed yet"),
        id="an edit not observed yet",
    ),
    pytest.param(_planned(sweep(), {}), "Progressing", id="runs being created"),
    pytest.param(
        _after(sweep(), dict.fromkeys(ALL, "Succeeded")), Health("Healthy", "Completed: 4 runs succeeded"), id="done"
    ),
    pytest.param(
        _after(sweep(), {**dict.fromkeys(ALL, "Succeeded"), W1S1: "Failed"}),
        Health("Healthy", "Completed: 3 runs succeeded, 1 failed"),
        id="done, a run failed under Continue",
    ),
    pytest.param(_after(sweep(policy="Stop"), {W1S1: "Failed"}), "Degraded", id="a failed run under Stop"),
    pytest.param(
        _planned(sweep(), {}, {W1S1: Problem(SweepReason.CREATE_FAILED, "HTTP 403: exceeded quota")}),
        "Degraded",
        id="a create refused",
    ),
]


@pytest.mark.multiproc
@pytest.mark.parametrize(("body", "health"), CASES)
def test_sweep_health(lua54: str, body: dict[str, Any], health: Health | str) -> None:
    got = run_health(SWEEP_SCRIPT, body, lua54)
    if isinstance(health, Health):
        assert got == health
    else:
        assert got.status == health, got
    if got.status == "Degraded":  # the reason and its message, as kubectl describe shows them
        stalled = next(c for c in body["status"]["conditions"] if c["type"] == "Stalled")
        assert got.message == f"{stalled['reason']}: {stalled['message']}"
    if got.status == "Progressing" and "status" in body and "generation 2" not in (got.message or ""):
        assert got.message == f"Progressing: {body['status']['message']}"


def test_the_sweep_script_is_lua51_as_in_argo_cd() -> None:
    """Argo CD embeds gopher-lua, a Lua 5.1: nothing newer (the run's script is checked the same way)."""
    import re

    from tests.gitops.test_argocd_health import NOT_IN_LUA51

    code = re.sub(r'--[^\n]*|"(?:[^"\\]|\\.)*"', "", SWEEP_SCRIPT.read_text())  # comments and strings out
    for what, pattern in NOT_IN_LUA51.items():
        assert not re.search(pattern, code), f"the sweep's health.lua uses {what}, which Lua 5.1 lacks"
