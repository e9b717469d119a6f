"""Bad input, reported the one way every ``mlbench`` command reports it: ``file:line:col: field: message``
(as ``mlbench validate`` does), then exit :data:`EXIT_BAD_INPUT`; never a traceback."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from pydantic import ValidationError

from mlbench_api.catalog import Document, read_documents
from mlbench_api.errors import InvalidObject, format_errors

#: The exit code of every command for input the user must fix (files, overrides, flags), as argparse exits on a
#: bad flag; 1 stays what a command's own failure returns (a run that failed, results that cannot be fetched).
EXIT_BAD_INPUT = 2

_FIELD = re.compile(r"^([A-Za-z][\w./-]*): ")
_POSITION = re.compile(r":\d+:\d+$")


class BadInput(ValueError):
    """Input the user must fix: ``problems`` (``field: message`` lines) about the file ``source`` (None: a flag,
    or no file), in its document of kind ``kind`` (None: its first)."""

    def __init__(self, problems: str | Sequence[str], source: str | None = None, kind: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        self.kind = kind
        super().__init__("; ".join(self.problems))


def bad_input(exc: Exception, source: str | None = None, kind: str | None = None) -> BadInput:
    """``exc`` (an invalid object, a validation or value error, an unknown name) as :class:`BadInput`."""
    if isinstance(exc, BadInput):
        return exc
    if isinstance(exc, InvalidObject):
        return BadInput(exc.problems, exc.source, kind)
    if isinstance(exc, ValidationError):
        return BadInput(format_errors(exc), source, kind)
    return BadInput(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc), source, kind)


def _document(source: str, kind: str | None) -> Document | None:
    try:
        documents, _ = read_documents(Path(source))
    except OSError:
        return None
    documents = [d for d in documents if not d.empty]
    return next((d for d in documents if d.kind == kind), documents[0] if documents else None)


def located(exc: BadInput) -> list[str]:
    """One ``file:line:col: field: message`` line per problem (``error: ...`` for one that no file holds)."""
    if exc.source is None:
        return [f"error: {problem}" for problem in exc.problems]
    if _POSITION.search(exc.source):  # a syntax error: the parser said where
        return [f"{exc.source}: {problem}" for problem in exc.problems]
    doc = _document(exc.source, exc.kind)
    lines = []
    for problem in exc.problems:
        problem = problem.removeprefix(f"{exc.source}: ")
        match = _FIELD.match(problem)
        where = doc.where(match.group(1)) if doc is not None and match else exc.source
        lines.append(f"{where}: {problem}")
    return lines


def report(exc: BadInput, stream: TextIO) -> int:
    """Print ``exc`` as :func:`located` says; :data:`EXIT_BAD_INPUT`."""
    for line in located(exc):
        print(line, file=stream)
    return EXIT_BAD_INPUT
