"""Metadata filters for `list`: validated once, matched in Python, never spliced into a query."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import InvalidFilterError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,127}$")
_SCALARS = (str, int, float, bool, type(None))


def validate_filter(filter: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check a metadata filter and return it as a plain dict.

    Keys must be identifiers (letters, digits, `_`, `-`; at most 128 characters). Values must be
    JSON-like: scalars, lists and dicts of them. Anything else raises `InvalidFilterError`.
    """
    if filter is None:
        return {}
    if not isinstance(filter, Mapping):
        raise InvalidFilterError(f"filter must be a dict of metadata keys, got {type(filter).__name__}")
    for key, value in filter.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise InvalidFilterError(
                f"invalid metadata filter key {key!r}: keys are identifiers "
                "(letters, digits, '_' or '-', starting with a letter or '_')"
            )
        _check_value(key, value)
    return dict(filter)


def _check_value(key: str, value: Any, depth: int = 0) -> None:
    if depth > 16:
        raise InvalidFilterError(f"metadata filter value for {key!r} is nested too deeply")
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_value(key, item, depth + 1)
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidFilterError(f"metadata filter value for {key!r} has a non-string key")
            _check_value(key, v, depth + 1)
        return
    raise InvalidFilterError(
        f"metadata filter value for {key!r} has type {type(value).__name__}; "
        "use strings, numbers, booleans, None, lists or dicts"
    )


def matches(metadata: Mapping[str, Any], filter: Mapping[str, Any]) -> bool:
    """True when every filter key is present in `metadata` with an equal value.

    A dict value matches by containment (like jsonb `@>`): every key it names must match.
    """
    return all(key in metadata and _contains(metadata[key], value) for key, value in filter.items())


def _contains(actual: Any, expected: Any) -> bool:
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and _contains(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        return list(expected) == list(actual)
    return bool(expected == actual)
