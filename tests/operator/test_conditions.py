"""The status vocabulary: every condition reason is documented, and stored as a plain string."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mlbench_api.runstatus import Phase
from mlbench_operator import conditions as c
from mlbench_operator.conditions import DatasetReason, Reason

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def section(title: str) -> str:
    """The text of ``## title`` up to the next level-2 heading."""
    text = DOCS.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, flags=re.M | re.S)
    assert match is not None, f"docs/operator.md has no section {title!r}"
    return match.group(1)


def names(text: str) -> set[str]:
    """CamelCase words in backticks: how the docs spell reasons, phases and condition types."""
    return set(re.findall(r"`([A-Z][A-Za-z]+)`", text))


@pytest.mark.parametrize("reason", [*Reason, *DatasetReason], ids=str)
def test_every_reason_is_documented(reason: str) -> None:
    assert reason in names(section("Status") + section("Failures and cleanup")), (
        f"{reason!r} is missing from docs/operator.md (Status or Failures and cleanup)"
    )


def test_the_status_table_names_only_reasons_that_exist() -> None:
    """The other direction: a reason the docs' conditions table names but the operator never writes."""
    rows = [line for line in section("Status").splitlines() if line.startswith("| `")]
    assert {row.split("`")[1] for row in rows} == set(c.TYPES)
    known = {*Reason, *DatasetReason, *Phase, *c.TYPES}
    assert names("\n".join(rows)) - known == set()


def test_reasons_are_stored_as_plain_strings() -> None:
    """Members compare equal to their strings; the status the API server gets holds plain strings."""
    conds = c.set_condition([], c.WORKERS_READY, "False", Reason.NAME_CONFLICT, "held", now=T0)
    conds = c.set_condition(conds, c.READY, "False", Phase.RUNNING, "", now=T0)
    assert [type(x["reason"]) for x in conds] == [str, str]
    assert [x["reason"] for x in conds] == ["NameConflict", "Running"]
    assert Reason.OOM_KILLED == "OOMKilled"
    assert f"{Reason.OOM_KILLED}" == "OOMKilled"


def test_typed_conditions_keep_the_transition_time_while_the_status_stays() -> None:
    later = T0.replace(hour=13)
    conds = c.put([], c.WORKERS_READY, "False", Reason.CREATING, "0/2", now=T0, generation=1)
    conds = c.put(conds, c.WORKERS_READY, "False", Reason.WAITING_FOR_WORKERS, "1/2", now=later, generation=2)
    found = c.find(conds, c.WORKERS_READY)
    assert found is not None
    assert (found.reason, found.message, found.observed_generation) == ("WaitingForWorkers", "1/2", 2)
    assert found.last_transition_time == T0  # a new reason or message with the same status
    conds = c.put(conds, c.WORKERS_READY, "True", Reason.ALL_WORKERS_READY, "2/2", now=later)
    found = c.find(conds, c.WORKERS_READY)
    assert found is not None
    assert found.last_transition_time == later  # the status flipped
    assert found.observed_generation is None
    assert c.holds(conds, c.WORKERS_READY)


@pytest.mark.parametrize("generation", [None, 3])
def test_typed_and_dict_conditions_agree(generation: int | None) -> None:
    """:func:`c.put` is :func:`c.set_condition` on typed conditions: same order, times, text and keys."""
    steps: list[tuple[str, c.ConditionStatus, str, str]] = [
        (c.STALLED, "False", Phase.RUNNING, ""),
        (c.WORKERS_READY, "False", Reason.NAME_CONFLICT, "held \x1b[2J" + "x" * 40000),
        ("Custom", "Unknown", "Other", "a foreign type sorts last"),
        (c.FAILED, "False", Reason.IN_PROGRESS, ""),
        (c.WORKERS_READY, "False", Reason.UNSCHEDULABLE, "0/3 nodes"),
        (c.WORKERS_READY, "True", Reason.ALL_WORKERS_READY, "2/2"),
    ]
    typed: list[c.ConditionModel] = []
    plain: list[c.Condition] = []
    for minute, (type_, status, reason, text) in enumerate(steps):
        now = T0.replace(minute=minute)
        typed = c.put(typed, type_, status, reason, text, now=now, generation=generation)
        plain = c.set_condition(plain, type_, status, reason, text, now=now, generation=generation)
        assert [x.to_api() for x in typed] == plain
