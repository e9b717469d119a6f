"""``-o/--output``: the format a command prints in, as kubectl's flag means (``-o yaml``, ``-o json``); a
directory is always ``--output-dir``. One place builds what a format prints, so every command prints a kind
the same way."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

#: The formats of objects (what ``kubectl get -o`` offers for them).
YAML = "yaml"
JSON = "json"
#: A command's own text: its table, or its lines.
TABLE = "table"
TEXT = "text"


def add_output(parser: argparse.ArgumentParser, choices: Sequence[str], default: str | None, what: str) -> None:
    """``-o/--output FORMAT`` on ``parser``: ``choices``, ``default`` (None: the command picks), ``what`` for help."""
    parser.add_argument("-o", "--output", choices=tuple(choices), default=default, help=f"output format: {what}")


def as_list(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several objects as one, as kubectl prints them: a ``v1 List`` (``kubectl apply`` applies its items)."""
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


def dump(items: Sequence[Mapping[str, Any]], fmt: str, *, single: bool = False) -> str:
    """``items`` (API objects, camelCase) as ``fmt`` (:data:`YAML` or :data:`JSON`): one object as itself when
    ``single``; several as a multi-document YAML stream, or a JSON ``v1 List``."""
    if fmt == JSON:
        body: Any = dict(items[0]) if single else as_list(items)
        return json.dumps(body, indent=2) + "\n"
    if fmt != YAML:
        raise ValueError(f"--output: expected {YAML} or {JSON}, got {fmt!r}")
    if single:
        return yaml.safe_dump(dict(items[0]), sort_keys=False)
    return yaml.safe_dump_all([dict(i) for i in items], sort_keys=False, explicit_start=True)
