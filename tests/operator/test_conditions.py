"""The status vocabulary: every condition reason is documented, and stored as a plain string."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mlbench_api.run import Phase
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
