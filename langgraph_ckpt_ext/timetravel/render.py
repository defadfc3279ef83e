"""Values as short, JSON-like text for people: `diff`, `lgckpt show` and `lgckpt diff`.

    brief({"at": datetime(2026, 1, 1)}, 60)   # '{"at": "2026-01-01T00:00:00"}'
    contrast("x" * 300 + "a", "x" * 300 + "b", 40)   # both cut around where they differ

Strings are quoted as JSON quotes them, `None`/`True` are `null`/`true`, dates are ISO 8601
strings, pydantic models and dataclasses show their class and the fields that differ from the
defaults (`ToolCall(id="c1", name="search")`), bytes show as `b"text"` when they are UTF-8 text
and as hex otherwise, messages as their class and content. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterator, Mapping
from datetime import date, datetime, time
from typing import Any

from langchain_core.messages import BaseMessage
from pydantic import BaseModel

ELLIPSIS = "…"
_BUDGET = 8192  # characters of one value's text worked on; the rest is cut


def text(value: Any, *, compact: bool = True) -> str:
    """`value` as JSON-like text on one line (at most a few thousand characters). `compact`
    shows a message as its class, content and tool calls; False shows its every field."""
    out: list[str] = []
    size = 0
    for piece in _pieces(value, compact):
        out.append(piece)
        size += len(piece)
        if size > _BUDGET:
            return "".join(out)[:_BUDGET] + ELLIPSIS
    return "".join(out)


def brief(value: Any, width: int) -> str:
    """`text(value)` in at most `width` characters; a list or dict cut short starts with its
    size (`3 items: [...`), so two of another length never read alike."""
    whole = text(value)
    if len(whole) <= width:
        return whole
    size = _size(value)
    head = "" if size is None else f"{size}: "
    return clip(head + whole, width)


def contrast(a: Any, b: Any, width: int) -> tuple[str, str]:
    """`a` and `b` in at most `width` characters each, cut around the first place their texts
    differ; never the same pair of texts for values of another type or text (falls back on
    every field, then on the type names)."""
    if isinstance(a, str) and isinstance(b, str):  # whole: they may differ past the budget
        old, new = json.dumps(a, ensure_ascii=False), json.dumps(b, ensure_ascii=False)
    else:
        old, new = text(a), text(b)
    if old == new:
        old, new = text(a, compact=False), text(b, compact=False)
    if old == new:
        old, new = f"{old} ({_type(a)})", f"{new} ({_type(b)})"
    if old == new:  # alike as far as text shows (a repr, the first _BUDGET characters)
        new += " (differs where the text does not show)"
    if len(old) <= width and len(new) <= width:
        return old, new
    # One start for both, a third of the width before the first difference, so that it shows
    # at the same place in each (even when one text is the start of the other).
    at = _common_prefix(old, new)
    start = max(0, min(at - width // 3, max(len(old), len(new)) - width))
    return _window(old, start, width), _window(new, start, width)


def _window(s: str, start: int, width: int) -> str:
    """`width` characters of `s` from `start` (fewer at its end), cut ends marked `…`."""
    end = start + width
    head = ELLIPSIS if start else ""
    tail = ELLIPSIS if end < len(s) else ""
    return head + s[start + len(head):end - len(tail)] + tail


def clip(s: str, width: int) -> str:
    """`s`, cut to `width` characters with `…` at the end if longer."""
    return s if len(s) <= width else s[: width - 1] + ELLIPSIS


def items(n: int) -> str:
    return f"{n} item" if n == 1 else f"{n} items"


def keys(n: int) -> str:
    return f"{n} key" if n == 1 else f"{n} keys"


def _size(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return keys(len(value))
    if isinstance(value, list | tuple | set | frozenset):
        return items(len(value))
    return None


def _type(v: Any) -> str:
    return type(v).__name__


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


# -- the text of a value -------------------------------------------------------------------------


def _pieces(v: Any, compact: bool) -> Iterator[str]:
    """The text of `v`, piece by piece (a caller stops reading at its budget)."""
    if v is None:
        yield "null"
    elif isinstance(v, bool):
        yield "true" if v else "false"
    elif isinstance(v, int | float):
        yield repr(v)
    elif isinstance(v, str):
        yield json.dumps(v, ensure_ascii=False)
    elif isinstance(v, datetime | date | time):
        yield json.dumps(v.isoformat())
    elif isinstance(v, bytes | bytearray | memoryview):
        yield _bytes(bytes(v))
    elif isinstance(v, enum.Enum):
        yield from _pieces(v.value, compact)
    elif isinstance(v, BaseMessage) and compact:
        yield from _message(v)
    elif isinstance(v, BaseModel):
        yield from _fields(_type(v), _model_fields(v), compact)
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        yield from _fields(_type(v), _dataclass_fields(v), compact)
    elif isinstance(v, Mapping):
        yield from _mapping(v, compact)
    elif isinstance(v, list | tuple | set | frozenset):
        yield from _sequence(v, compact)
    else:
        yield repr(v)


def _bytes(b: bytes) -> str:
    try:
        decoded = b.decode()
    except UnicodeDecodeError:
        decoded = None
    if decoded is None or not decoded.replace("\n", "").replace("\t", "").isprintable():
        return f"<{len(b)} byte{'' if len(b) == 1 else 's'} {b[:_BUDGET // 2].hex()}>"
    return "b" + json.dumps(decoded, ensure_ascii=False)


def _message(m: BaseMessage) -> Iterator[str]:
    yield f"{_type(m)} "
    yield from _pieces(m.content, True)
    calls = getattr(m, "tool_calls", None)
    if calls:
        yield " tool_calls=" + json.dumps([c.get("name") for c in calls], ensure_ascii=False)


def _sequence(v: Any, compact: bool) -> Iterator[str]:
    yield "["
    for i, x in enumerate(v):
        if i:
            yield ", "
        yield from _pieces(x, compact)
    yield "]"


def _mapping(v: Mapping[Any, Any], compact: bool) -> Iterator[str]:
    yield "{"
    for i, (k, x) in enumerate(v.items()):
        if i:
            yield ", "
        yield from _pieces(k if isinstance(k, str) else text(k), compact)
        yield ": "
        yield from _pieces(x, compact)
    yield "}"


def _fields(name: str, fields: Iterator[tuple[str, Any]], compact: bool) -> Iterator[str]:
    yield f"{name}("
    for i, (k, x) in enumerate(fields):
        if i:
            yield ", "
        yield f"{k}="
        yield from _pieces(x, compact)
    yield ")"


def _model_fields(m: BaseModel) -> Iterator[tuple[str, Any]]:
    """A model's fields that differ from their defaults, then its extra fields."""
    for name, info in type(m).model_fields.items():
        value = getattr(m, name)
        if info.is_required() or not _equal(value, _default(info)):
            yield name, value
    yield from (m.model_extra or {}).items()


def _default(info: Any) -> Any:
    try:
        return info.get_default(call_default_factory=True)
    except Exception:  # a factory that needs the other fields' values
        return dataclasses.MISSING


def _dataclass_fields(v: Any) -> Iterator[tuple[str, Any]]:
    for f in dataclasses.fields(v):
        value = getattr(v, f.name)
        if f.default_factory is not dataclasses.MISSING:
            default: Any = f.default_factory()
        else:
            default = f.default
        if default is dataclasses.MISSING or not _equal(value, default):
            yield f.name, value


def _equal(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # values whose `==` is not a truth value (arrays)
        return False
