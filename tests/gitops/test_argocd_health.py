"""Argo CD's health check for BenchmarkRun, run by a real Lua interpreter over recorded objects.

The cases are Argo CD's own layout (``health_test.yaml`` + ``testdata/``, next to ``health.lua``), so the
same folder also works in Argo CD's test harness. The expected health of every case is pinned a
second time below, independently of ``health_test.yaml`` (a wrong mapping cannot pass by editing both
files), and mutants of the script must each fail at least one case (the cases really discriminate).
The recorded objects are valid BenchmarkRuns (the API models accept them) and follow the status contract.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_api import BenchmarkRun
from tests.gitops import lua
from tests.gitops.lua import Health, run_health

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "manifests" / "gitops" / "argocd" / "health-check" / "mlbench.io" / "BenchmarkRun"
SCRIPT = CHECK / "health.lua"
CASES: list[dict[str, Any]] = yaml.safe_load((CHECK / "health_test.yaml").read_text())["tests"]
STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}

#: The mapping (docs/gitops.md), pinned independently of health_test.yaml: testdata file -> health.
EXPECTED = {
    "no_status.yaml": "Progressing",
    "stale_generation.yaml": "Progressing",
    "pending.yaml": "Progressing",
    "starting.yaml": "Progressing",
    "running.yaml": "Progressing",
    "running_stalled.yaml": "Degraded",
    "failed_deadline.yaml": "Degraded",
    "failed_rejected.yaml": "Degraded",
    "succeeded_goal_reached.yaml": "Healthy",
    "succeeded_goal_not_reached.yaml": "Healthy",
    "succeeded_goal_unknown.yaml": "Healthy",
    "succeeded_result_only.yaml": "Healthy",
}
#: kstatus conditions by phase, per the status contract (Ready, Reconciling; Stalled is checked apart).
KSTATUS = {
    "Pending": ("False", "True"),
    "Starting": ("False", "True"),
    "Running": ("False", "True"),
    "Succeeded": ("True", "False"),
    "Failed": ("False", "False"),
}


def load(input_path: str) -> dict[str, Any]:
    obj = yaml.safe_load((CHECK / input_path).read_text())
    assert isinstance(obj, dict)
    return obj


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _expected(case: dict[str, Any]) -> Health:
    return Health(case["healthStatus"]["status"], case["healthStatus"]["message"])


def _outcome(script: Path, case: dict[str, Any], interpreter: str) -> Health | str:
    """The health, or the Lua error (Argo CD would show Unknown)."""
    try:
        return run_health(script, load(case["inputPath"]), interpreter)
    except RuntimeError as err:
        return str(err)


def _case_id(case: dict[str, Any]) -> str:
    return Path(case["inputPath"]).stem


@pytest.mark.multiproc
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_case(lua54: str, case: dict[str, Any]) -> None:
    assert run_health(SCRIPT, load(case["inputPath"]), lua54) == _expected(case)


def test_cases_cover_the_mapping() -> None:
    """Every testdata object is a case, every required situation is there, with the pinned health."""
    on_disk = {p.name for p in (CHECK / "testdata").glob("*.yaml")}
    in_cases = [Path(c["inputPath"]).name for c in CASES]
    assert sorted(in_cases) == sorted(on_disk), "testdata/ and health_test.yaml disagree"
    assert set(EXPECTED) == on_disk
    for case in CASES:
        name, health = Path(case["inputPath"]).name, case["healthStatus"]
        assert health["status"] == EXPECTED[name], name
        assert set(health) == {"status", "message"}, f"{name}: Argo CD's test reads status and message"
    messages = {Path(c["inputPath"]).name: c["healthStatus"]["message"] for c in CASES}
    assert messages["no_status.yaml"].startswith("Waiting for the operator")
    assert messages["stale_generation.yaml"].startswith("Waiting for the operator")
    assert messages["succeeded_goal_reached.yaml"].startswith("Succeeded, goal reached")
    assert messages["succeeded_goal_not_reached.yaml"].startswith("Succeeded without reaching the goal")
    for name in ("failed_deadline.yaml", "failed_rejected.yaml", "running_stalled.yaml"):
        obj = load(f"testdata/{name}")
        cond = conditions(obj).get("Stalled") if name == "running_stalled.yaml" else conditions(obj)["Failed"]
        assert cond is not None
        assert messages[name] == f"{cond['reason']}: {cond['message']}", name


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_testdata_are_benchmark_runs_under_the_status_contract(case: dict[str, Any]) -> None:
    obj = load(case["inputPath"])
    BenchmarkRun.model_validate(obj)  # what the API server (CRD from these models) would accept
    status = obj.get("status")
    if not status:
        return
    assert status["phase"] in KSTATUS
    conds = conditions(obj)
    for cond in conds.values():
        assert cond.get("observedGeneration", 0) <= obj["metadata"]["generation"]
    if "Ready" not in conds:  # an operator without the kstatus conditions (failed_rejected, result_only)
        assert not {"Reconciling", "Stalled"} & set(conds)
        return
    ready, reconciling = KSTATUS[status["phase"]]
    assert conds["Ready"]["status"] == ready
    assert conds["Reconciling"]["status"] == reconciling
    stalled = conds["Stalled"]
    if status["phase"] == "Failed":
        assert stalled["status"] == "True"
        assert stalled["reason"] == conds["Ready"]["reason"] == conds["Failed"]["reason"]
    elif stalled["status"] == "True":
        assert status["phase"] == "Running"
        assert stalled["reason"] == "NoProgress"
    if status["phase"] == "Succeeded":
        assert conds["Ready"]["reason"] == "Succeeded"
        assert "GoalReached" in conds


# Each mutant breaks one rule of the mapping; the cases must notice every one of them.
MUTANTS = {
    "stale generation ignored": ("observed < generation", "observed > generation"),
    "missing status not waited for": ("if status == nil then", "if false then"),
    "Failed phase not degraded": ('if status.phase == "Failed" then', 'if status.phase == "Failure" then'),
    "Stalled ignored": ("if isTrue(stalled) then", "if false then"),
    "Succeeded not healthy": ('hs.status = "Healthy"', 'hs.status = "Progressing"'),
    "goal always reached": ('reached = goal.status == "True"', "reached = true"),
    "result fallback ignored": ("reached = status.result.goalReached", "reached = nil"),
    "phase dropped from the progress message": ("joined(status.phase, status.message)", "status.message"),
}


@pytest.mark.multiproc
@pytest.mark.parametrize("mutant", MUTANTS, ids=list(MUTANTS))
def test_a_wrong_mapping_fails_a_case(lua54: str, tmp_path: Path, mutant: str) -> None:
    old, new = MUTANTS[mutant]
    source = SCRIPT.read_text()
    assert source.count(old) == 1, f"mutant {mutant!r} no longer matches health.lua; update MUTANTS"
    script = tmp_path / "health.lua"
    script.write_text(source.replace(old, new))
    failing = [c["inputPath"] for c in CASES if _outcome(script, c, lua54) != _expected(c)]
    assert failing, f"no case notices the mutant {mutant!r}"


#: Lua 5.2+ syntax and library that gopher-lua (Lua 5.1) lacks
NOT_IN_LUA51 = {
    "goto": r"\bgoto\b",
    "integer division": r"//",
    "attributes": r"<(const|close)>",
    "_ENV": r"\b_ENV\b",
    "bitwise operators": r"&|\||<<|>>|~(?!=)",
    "5.3+ library": r"\butf8\.|table\.(unpack|move)|math\.(tointeger|type|ult)|string\.(pack|unpack)",
}


def test_lua51_as_in_argo_cd() -> None:
    """Argo CD embeds gopher-lua, a Lua 5.1: the script uses nothing newer, and where lua5.1 is
    installed (it is optional; only lua5.4 is in `make system-deps`) it gives the same answers there."""
    code = re.sub(r'--[^\n]*|"(?:[^"\\]|\\.)*"', "", SCRIPT.read_text())  # comments and strings out
    for what, pattern in NOT_IN_LUA51.items():
        assert not re.search(pattern, code), f"health.lua uses {what}, which Lua 5.1 lacks"
    found = lua.interpreter(lua.LUA51)
    if found is not None:
        for case in CASES:
            assert run_health(SCRIPT, load(case["inputPath"]), found) == _expected(case), case["inputPath"]


@pytest.mark.multiproc
def test_the_operators_own_failed_status(lua54: str) -> None:
    """A status built by the operator's code (a rejected run), not by hand, is Degraded with its reason."""
    from mlbench_operator.run import admission

    body = load("testdata/no_status.yaml")
    rejection = admission.Rejection("TaskNotFound", "BenchmarkTask 'nope' does not exist")
    status = admission.rejected_status(body, rejection, datetime(2025, 6, 2, 8, tzinfo=UTC))
    health = run_health(SCRIPT, {**body, "status": status}, lua54)
    assert health == Health("Degraded", "TaskNotFound: BenchmarkTask 'nope' does not exist")


ODD = {
    "empty status": {"status": {}},
    "empty conditions": {"status": {"observedGeneration": 1, "conditions": []}},
    "unknown phase": {"status": {"observedGeneration": 1, "phase": "Suspended"}},
    "conditions without fields": {"status": {"observedGeneration": 1, "phase": "Succeeded", "conditions": [{}]}},
    "no generation": {"metadata": {"name": "x"}, "status": {"phase": "Running"}},
    "observed ahead": {"status": {"observedGeneration": 5, "phase": "Running", "message": "m"}},
    "stalled without reason": {
        "status": {"observedGeneration": 1, "phase": "Running", "conditions": [{"type": "Stalled", "status": "True"}]}
    },
    "failed with nothing else": {"status": {"observedGeneration": 1, "phase": "Failed"}},
}


@pytest.mark.multiproc
@pytest.mark.parametrize("patch", ODD.values(), ids=list(ODD))
def test_odd_objects_get_a_health_not_a_lua_error(lua54: str, patch: dict[str, Any]) -> None:
    """Argo CD turns a script error into Unknown health: no shape of status may raise one."""
    obj = {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkRun", "metadata": {"name": "x", "generation": 1}}
    health = run_health(SCRIPT, {**obj, **patch}, lua54)
    assert health.status in STATUSES - {"Unknown"}
    assert health.message


@pytest.mark.multiproc
def test_the_harness_carries_the_object_faithfully(lua54: str, tmp_path: Path) -> None:
    """Strings with quotes, backslashes, newlines and UTF-8; ints; booleans; nested lists survive the trip."""
    script = tmp_path / "echo.lua"
    script.write_text(
        "local hs = {}\n"
        "hs.status = obj.s\n"
        "hs.message = obj.m .. '|' .. tostring(obj.n + 1) .. '|' .. tostring(obj.b) .. '|' .. obj.l[2][1]"
        " .. '|' .. tostring(obj.absent)\n"
        "return hs\n"
    )
    text = 'Ünïcode "quoted" \\ back\nslash\t\x01end'
    health = run_health(
        script, {"s": "Healthy", "m": text, "n": 41, "b": False, "l": [1, ["x"]], "absent": None}, lua54
    )
    assert health == Health("Healthy", f"{text}|42|false|x|nil")


@pytest.mark.multiproc
def test_the_harness_refuses_undefined_globals(lua54: str, tmp_path: Path) -> None:
    script = tmp_path / "typo.lua"
    script.write_text('local hs = {}\nhs.status = "Healthy"\nif objj == nil then hs.message = "x" end\nreturn hs\n')
    with pytest.raises(RuntimeError, match="undefined global 'objj'"):
        run_health(script, {}, lua54)


@pytest.mark.multiproc
def test_statuses_the_operator_writes_get_the_right_health(lua54: str) -> None:
    """The operator's real statuses along a run (planned by reconcile, finalized as written): Progressing
    while it starts and runs, Degraded when the step counter stalls, Healthy once it Succeeded."""
    from datetime import timedelta

    from mlbench_operator import conditions as c
    from mlbench_operator import runpods
    from mlbench_operator.run import policies
    from mlbench_operator.run import status as run_status
    from tests import factories
    from tests.operator import helpers as h
    from tests.operator.test_reconcile import admitted, pod, terminated, workers

    t0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
    body, ctx = admitted(h.run(), t0)
    body["metadata"]["generation"] = 1

    def health(status: dict[str, Any]) -> Health:
        status = run_status.finalize(status, t0)
        return run_health(SCRIPT, {**body, "status": {**status, "observedGeneration": 1}}, lua54)

    assert health(body["status"]).status == "Progressing"  # admitted, creating workers
    pods = [*workers(ctx), pod(runpods.launcher_pod(ctx, 0))]
    running = policies.plan(body, ctx, pods, t0).status
    assert running["phase"] == "Running"
    assert health(running).status == "Progressing"
    since = c.timestamp(t0 - timedelta(seconds=900))
    stuck = {**body, "status": {**running, "progress": {"step": 7, "stepChangedAt": since}}}
    stalled = health(policies.plan(stuck, ctx, pods, t0).status)
    assert stalled.status == "Degraded"
    assert "NoProgress" in (stalled.message or "")
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    succeeded = policies.plan({**body, "status": running}, ctx, [*workers(ctx), done], t0).status
    assert health(succeeded).status == "Healthy"
