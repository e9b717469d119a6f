"""Every valid example parses; every invalid one fails with an error naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from mlbench_api.catalog import parse_run, parse_task
from mlbench_api.errors import InvalidObject
from tests.api.examples import invalid_examples, valid_examples


def _parse(doc: dict[str, Any], source: str) -> object:
    return parse_run(doc, source) if doc["kind"] == "BenchmarkRun" else parse_task(doc, source)


@pytest.mark.parametrize(("name", "doc"), valid_examples(), ids=[n for n, _ in valid_examples()])
def test_valid_example_parses_and_round_trips(name: str, doc: dict[str, Any]) -> None:
    obj = _parse(doc, name)
    again = _parse(obj.to_api(), name)  # type: ignore[attr-defined]
    assert again == obj


@pytest.mark.parametrize(("name", "doc", "field"), invalid_examples(), ids=[n for n, _, _ in invalid_examples()])
def test_invalid_example_names_the_field(name: str, doc: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidObject) as info:
        _parse(doc, name)
    assert any(field in problem for problem in info.value.problems), info.value.problems


def test_there_are_examples_of_both_kinds() -> None:
    kinds = {doc["kind"] for _, doc in valid_examples()} | {doc["kind"] for _, doc, _ in invalid_examples()}
    assert kinds == {"BenchmarkRun", "BenchmarkTask"}
    assert len(invalid_examples()) >= 20
