"""Errors that name the offending field, the way ``kubectl apply`` does."""

from __future__ import annotations

import re

from pydantic import ValidationError

# Cross-field rules raise "relative.field: message"; fold that into the error's location.
_FIELD_PREFIX = re.compile(r"^([a-z][A-Za-z0-9]*(?:\.[a-z][A-Za-z0-9]*)*): (.*)$", re.S)


def format_errors(exc: ValidationError) -> list[str]:
    """One ``field.path: message`` line per pydantic error, with wire (camelCase) names."""
    lines = []
    for err in exc.errors():
        path = ".".join(str(part) for part in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        match = _FIELD_PREFIX.match(message)
        if match and err["type"] == "value_error":
            field, message = match.groups()
            path = f"{path}.{field}" if path and not field.startswith("metadata.") else field
        lines.append(f"{path}: {message}" if path else message)
    return lines


class InvalidObject(ValueError):
    """An object failed validation; ``problems`` are ``field: message`` lines."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))
