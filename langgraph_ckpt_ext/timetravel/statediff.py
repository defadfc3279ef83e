"""A structured diff of two LangGraph states (their channel values), and its rendering.

    d = diff_values(older, newer, labels=("ckpt-1", "ckpt-2"))
    print(d)                    # one line per change
    d.apply(older) == newer     # True

Dicts are compared by key and pydantic models of one class by field; lists of messages with
ids by message id; a list that only grew at its end is `appended`; any other difference is a
whole-value `changed`, whose rendering names the items (of two lists) or keys (of two dicts of
other types) that differ. Values render as JSON-like text (see `render`), cut around where two
differ. Pure: nothing here reads or writes a checkpoint.
"""

from __future__ import annotations

import copy
import difflib
import html
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time
from typing import Any, Literal, TypeAlias

from langchain_core.messages import BaseMessage
from pydantic import BaseModel

from . import render

Kind = Literal[
    "added", "removed", "changed", "message_added", "message_removed", "message_edited", "appended"
]
Path: TypeAlias = tuple[Hashable, ...]

_MESSAGE_KINDS = frozenset({"message_added", "message_removed", "message_edited"})
_SYMBOL: dict[str, str] = {
    "added": "+", "removed": "-", "changed": "~", "appended": "+",
    "message_added": "+", "message_removed": "-", "message_edited": "~",
}
_COLOR: dict[str, str] = {
    "added": "#e6ffed", "removed": "#ffeef0", "changed": "#fff8c5", "appended": "#e6ffed",
    "message_added": "#e6ffed", "message_removed": "#ffeef0", "message_edited": "#fff8c5",
}
_PATH_WIDTH = 48
_VALUE_WIDTH = 60
_LINE_VALUE = 2 * _VALUE_WIDTH + 20

_EDITS = 3  # items or keys that differ shown on a line
_ALIGN_CELLS = 40_000  # items of two lists aligned by difflib at most (old x new)


class _Missing:
    """Marks a key that is absent (so a removal can pass through `_patch`)."""


_MISSING = _Missing()


@dataclass(frozen=True)
class Change:
    """One difference at `path` (channel name first).

    `added`: `new` only; `removed`: `old` only; `changed`: both, `delta` = new - old for numbers.
    `message_*`: the path ends with the message id; `old` / `new` are messages.
    `appended`: `new` holds the items added at the list's end.
    """

    path: Path
    kind: Kind
    old: Any = None
    new: Any = None
    delta: int | float | None = None

    @property
    def channel(self) -> str:
        return str(self.path[0])

    @property
    def target(self) -> Path:
        """The path of the value this change rewrites (a message change rewrites its list)."""
        return self.path[:-1] if self.kind in _MESSAGE_KINDS else self.path

    def path_text(self) -> str:
        if self.kind in _MESSAGE_KINDS:
            return f"{_path_text(self.path[:-1])}[id={self.path[-1]}]"
        return _path_text(self.path)

    def detail(self) -> str:
        """The change's values, shortened around where they differ: `old -> new (+delta)`,
        the items or keys that differ for two lists or dicts, or the one side there is."""
        if self.kind in ("added", "message_added"):
            return _show(self.new)
        if self.kind in ("removed", "message_removed"):
            return _show(self.old)
        if self.kind == "appended":
            return f"+= {_show(self.new)}"
        parts = _parts(self.old, self.new)
        if parts is not None:
            return _parts_text(*parts)
        old, new = render.contrast(self.old, self.new, _VALUE_WIDTH)
        text = f"{old} -> {new}"
        return text if self.delta is None else f"{text} ({_signed(self.delta)})"

    def sides(self) -> tuple[str, str]:
        """The old and the new side of `detail`, each on its own ("" for a side there is
        not); never alike when both are there."""
        if self.kind in ("added", "message_added", "appended"):
            return "", _show(self.new)
        if self.kind in ("removed", "message_removed"):
            return _show(self.old), ""
        parts = _parts(self.old, self.new)
        if parts is None:
            return render.contrast(self.old, self.new, _VALUE_WIDTH)
        (head_old, head_new), edits = parts
        old = [f"{mark}{label} {o}" for mark, label, o, _ in edits if mark != "+"]
        new = [f"{mark}{label} {n}" for mark, label, _, n in edits if mark != "-"]
        return (": ".join([head_old, ", ".join(old)]) if old else head_old,
                ": ".join([head_new, ", ".join(new)]) if new else head_new)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": [_json_key(k) for k in self.path], "kind": self.kind}
        if self.kind not in ("added", "message_added", "appended"):
            out["old"] = _jsonable(self.old)
        if self.kind not in ("removed", "message_removed"):
            out["new"] = _jsonable(self.new)
        if self.delta is not None:
            out["delta"] = self.delta
        return out

    def __str__(self) -> str:
        return f"{_SYMBOL[self.kind]} {self.path_text()}: {self.detail()}"


@dataclass
class StateDiff:
    """The changes from state `a` to state `b`; falsy when there are none.

    `message_order` holds, for each message list diffed by id, the ids of `b`'s list in order.
    """

    changes: list[Change] = field(default_factory=list)
    labels: tuple[str, str] | None = None
    message_order: dict[Path, tuple[str, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.changes)

    def __len__(self) -> int:
        return len(self.changes)

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    @property
    def channels_added(self) -> list[str]:
        """Channels in `b` only."""
        return [c.channel for c in self.changes if len(c.path) == 1 and c.kind == "added"]

    @property
    def channels_removed(self) -> list[str]:
        """Channels in `a` only."""
        return [c.channel for c in self.changes if len(c.path) == 1 and c.kind == "removed"]

    @property
    def channels_changed(self) -> list[str]:
        """Channels in both whose values differ."""
        whole = {*self.channels_added, *self.channels_removed}
        return list(dict.fromkeys(c.channel for c in self.changes if c.channel not in whole))

    def apply(self, a: Mapping[str, Any]) -> dict[str, Any]:
        """`a` with these changes made (`b`, for the `a` this diff was made from); `a` is not
        modified, and unchanged values are shared with it."""
        out: dict[str, Any] = self._patch(dict(a), [(c.target, c) for c in self.changes], ())
        return out

    def _patch(self, value: Any, items: list[tuple[Path, Change]], at: Path) -> Any:
        own = [c for rel, c in items if not rel]
        if own:
            return self._patch_here(value, own, at)
        groups: dict[Hashable, list[tuple[Path, Change]]] = {}
        for rel, c in items:
            groups.setdefault(rel[0], []).append((rel[1:], c))
        if isinstance(value, BaseModel):
            update = {
                str(k): self._patch(getattr(value, str(k)), sub, (*at, k)) for k, sub in groups.items()
            }
            return value.model_copy(update=update)
        if not isinstance(value, dict):
            raise ValueError(f"diff does not apply: {_path_text(at)} is a {type(value).__name__}")
        out = copy.copy(value)
        for k, sub in groups.items():
            new = self._patch(value.get(k, _MISSING), sub, (*at, k))
            if new is _MISSING:
                out.pop(k, None)
            else:
                out[k] = new
        return out

    def _patch_here(self, value: Any, own: list[Change], at: Path) -> Any:
        first = own[0]
        if first.kind in ("added", "changed"):
            return first.new
        if first.kind == "removed":
            return _MISSING
        if first.kind == "appended":
            return [*value, *first.new]
        by_id = {m.id: m for m in value}
        for c in own:
            if c.kind == "message_removed":
                by_id.pop(c.path[-1], None)
            else:
                by_id[c.path[-1]] = c.new
        order = self.message_order.get(at, tuple(by_id))
        try:
            return [by_id[i] for i in order]
        except KeyError as e:
            raise ValueError(f"diff does not apply: no message {e} at {_path_text(at)}") from None

    def to_text(self) -> str:
        """One aligned line per change, under a `--- a` / `+++ b` header when labelled."""
        head = [f"--- {self.labels[0]}", f"+++ {self.labels[1]}"] if self.labels else []
        if not self.changes:
            return "\n".join([*head, "(no changes)"])
        paths = [c.path_text() for c in self.changes]
        width = min(max(map(len, paths)), _PATH_WIDTH) + 1
        lines = [
            f"{_SYMBOL[c.kind]} {p + ':':<{width}} {c.detail()}"
            for c, p in zip(self.changes, paths, strict=True)
        ]
        return "\n".join([*head, *lines])

    def __str__(self) -> str:
        return self.to_text()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: `json.dumps(d.to_dict())` works whatever the values are."""
        return {
            "labels": list(self.labels) if self.labels else None,
            "changes": [c.to_dict() for c in self.changes],
            "message_order": [
                {"path": [_json_key(k) for k in path], "ids": list(ids)}
                for path, ids in self.message_order.items()
            ],
        }

    def _repr_html_(self) -> str:
        esc = html.escape
        caption = (
            f"<caption>{esc(self.labels[0])} &rarr; {esc(self.labels[1])}</caption>"
            if self.labels else ""
        )
        if not self.changes:
            return f"<table>{caption}<tr><td><em>no changes</em></td></tr></table>"
        rows = []
        for c in self.changes:
            old, new = c.sides()
            delta = "" if c.delta is None else _signed(c.delta)
            cells = "".join(
                f"<td>{esc(text)}</td>"
                for text in (_SYMBOL[c.kind], c.path_text(), c.kind, old, new, delta)
            )
            rows.append(f'<tr style="background:{_COLOR[c.kind]};color:#000">{cells}</tr>')
        head = "".join(f"<th>{h}</th>" for h in ("", "path", "kind", "old", "new", "&Delta;"))
        return (
            f'<table class="state-diff">{caption}<thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>"
        )


def diff_values(
    a: Mapping[str, Any], b: Mapping[str, Any], *, labels: tuple[str, str] | None = None
) -> StateDiff:
    """The changes that turn channel values `a` into `b`; `labels` name them when rendered."""
    diff = StateDiff(labels=labels)
    for name, old in a.items():
        if name in b:
            _diff((name,), old, b[name], diff)
        else:
            diff.changes.append(Change((name,), "removed", old=old))
    for name, new in b.items():
        if name not in a:
            diff.changes.append(Change((name,), "added", new=new))
    return diff


# -- comparing -----------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same type all the way down (`1`, `1.0` and `True` differ)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # values whose `==` is not a truth value (arrays)
        return False


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _fields(m: BaseModel) -> dict[str, Any]:
    return {name: getattr(m, name) for name in type(m).model_fields} | (m.model_extra or {})


def _by_field(a: BaseModel, b: BaseModel) -> bool:
    """Whether `b` is `a` with some field values replaced (so `model_copy(update=)` rebuilds it)."""
    return (
        type(a) is type(b)
        and (a.model_extra or {}).keys() == (b.model_extra or {}).keys()
        and getattr(a, "__pydantic_private__", None) == getattr(b, "__pydantic_private__", None)
    )


def _message_ids(items: list[Any]) -> list[str] | None:
    """The ids of a list of messages, or None unless every item is a message with its own id."""
    ids: list[str] = []
    for m in items:
        if not isinstance(m, BaseMessage) or not isinstance(m.id, str) or not m.id:
            return None
        ids.append(m.id)
    return ids if len(set(ids)) == len(ids) else None


def _diff(path: Path, a: Any, b: Any, diff: StateDiff) -> None:
    if _same(a, b):
        return
    out = diff.changes
    if isinstance(a, dict) and type(a) is type(b):
        for k, old in a.items():
            if k in b:
                _diff((*path, k), old, b[k], diff)
            else:
                out.append(Change((*path, k), "removed", old=old))
        out.extend(Change((*path, k), "added", new=new) for k, new in b.items() if k not in a)
        return
    if isinstance(a, BaseModel) and isinstance(b, BaseModel) and _by_field(a, b):
        old_fields, new_fields = _fields(a), _fields(b)
        for name, old in old_fields.items():
            _diff((*path, name), old, new_fields[name], diff)
        return
    if isinstance(a, list) and type(a) is type(b):
        ids_a, ids_b = _message_ids(a), _message_ids(b)
        if ids_a is not None and ids_b is not None and _diff_messages(path, a, b, ids_a, ids_b, diff):
            return
        if len(a) < len(b) and _same(a, b[: len(a)]):
            out.append(Change(path, "appended", new=b[len(a):]))
            return
    delta = b - a if _is_number(a) and _is_number(b) else None
    out.append(Change(path, "changed", old=a, new=b, delta=delta))


def _diff_messages(
    path: Path, a: Sequence[BaseMessage], b: Sequence[BaseMessage],
    ids_a: list[str], ids_b: list[str], diff: StateDiff,
) -> bool:
    """Message changes by id; False for a list only reordered (left to a whole `changed`)."""
    old, new = dict(zip(ids_a, a, strict=True)), dict(zip(ids_b, b, strict=True))
    found = [Change((*path, i), "message_removed", old=m) for i, m in old.items() if i not in new]
    for i, m in new.items():
        if i not in old:
            found.append(Change((*path, i), "message_added", new=m))
        elif not _same(old[i], m):
            found.append(Change((*path, i), "message_edited", old=old[i], new=m))
    if not found:
        return False
    diff.changes.extend(found)
    diff.message_order[path] = tuple(ids_b)
    return True


# -- rendering -----------------------------------------------------------------------------------


def _path_text(path: Path) -> str:
    text = ""
    for i, key in enumerate(path):
        if isinstance(key, str) and key.isidentifier():
            text += f".{key}" if i else key
        elif isinstance(key, str):
            text += f"[{render.text(key)}]"
        else:
            text += f"[{key!r}]"
    return text


def _show(v: Any) -> str:
    return render.brief(v, _VALUE_WIDTH)


# (mark, label, old text, new text) of an item or key that differs: `~` both, `-` old, `+` new
_Edit: TypeAlias = tuple[str, str, str, str]


def _parts(a: Any, b: Any) -> tuple[tuple[str, str], list[_Edit]] | None:
    """For two lists (tuples) or two dicts: a header per side (their sizes, and their types
    if these differ) and the items or keys that differ; None for other values."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        edits = _item_edits(a, b)
        heads = render.items(len(a)), render.items(len(b))
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        edits = _key_edits(a, b)
        heads = render.keys(len(a)), render.keys(len(b))
    else:
        return None
    if type(a) is not type(b):
        heads = f"{type(a).__name__} of {heads[0]}", f"{type(b).__name__} of {heads[1]}"
    return heads, _edit_texts(edits, len(heads[0]) + len(heads[1]))


def _item_edits(a: Sequence[Any], b: Sequence[Any]) -> list[tuple[str, str, Any, Any]]:
    """The items of `a` and `b` that differ, by index: between their longest common head and
    tail, aligned as `difflib` aligns lines (on the items' text) when there are not too many."""
    n = min(len(a), len(b))
    head = 0
    while head < n and _same(a[head], b[head]):
        head += 1
    tail = 0
    while tail < n - head and _same(a[-1 - tail], b[-1 - tail]):
        tail += 1
    old, new = a[head:len(a) - tail], b[head:len(b) - tail]
    if len(old) * len(new) > _ALIGN_CELLS:
        blocks = [("replace", 0, len(old), 0, len(new))]
    else:
        def key(x: Any) -> tuple[str, str]:
            return type(x).__name__, render.text(x)

        matcher = difflib.SequenceMatcher(None, [key(x) for x in old], [key(x) for x in new],
                                          autojunk=False)
        blocks = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    edits = []
    for _, i1, i2, j1, j2 in blocks:
        for k in range(max(i2 - i1, j2 - j1)):
            i, j = i1 + k, j1 + k
            if i < i2 and j < j2:
                edits.append(("~", f"[{head + j}]", old[i], new[j]))
            elif i < i2:
                edits.append(("-", f"[{head + i}]", old[i], None))
            else:
                edits.append(("+", f"[{head + j}]", None, new[j]))
    return edits


def _key_edits(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> list[tuple[str, str, Any, Any]]:
    def label(k: Any) -> str:
        return f"{render.text(k)}:"

    edits = [("-", label(k), v, None) if k not in b else ("~", label(k), v, b[k])
             for k, v in a.items() if k not in b or not _same(v, b[k])]
    return edits + [("+", label(k), None, v) for k, v in b.items() if k not in a]


def _edit_texts(edits: list[tuple[str, str, Any, Any]], used: int) -> list[_Edit]:
    """The first few edits as text, their values sharing what is left of a line's width; a
    last `…` entry counts the rest."""
    shown = edits[:_EDITS]
    slots = sum(2 if mark == "~" else 1 for mark, *_ in shown) or 1
    width = max(16, (_LINE_VALUE - used - 10 * len(shown)) // slots)
    out: list[_Edit] = []
    for mark, label, old, new in shown:
        if mark == "~":
            o, n = render.contrast(old, new, width)
        else:
            o = n = render.brief(old if mark == "-" else new, width)
        out.append((mark, label, o, n))
    if len(edits) > len(shown):
        more = f"{len(edits) - len(shown)} more"
        out.append(("", render.ELLIPSIS, more, more))
    return out


def _parts_text(heads: tuple[str, str], edits: list[_Edit]) -> str:
    entries = []
    for mark, label, old, new in edits:
        if mark == "~":
            entries.append(f"~{label} {old} -> {new}")
        else:
            entries.append(f"{mark}{label} {new if mark == '+' else old}")
    text = f"{heads[0]} -> {heads[1]}"
    return f"{text}: {', '.join(entries)}" if entries else text


def _signed(n: int | float) -> str:
    return f"{n:+}" if isinstance(n, int) else f"{n:+.6g}"


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, BaseMessage):
        return _jsonable(v.model_dump())
    if isinstance(v, BaseModel):
        try:
            return v.model_dump(mode="json")
        except Exception:  # a field pydantic cannot serialize
            return repr(v)
    if isinstance(v, datetime | date | time):
        return v.isoformat()
    if isinstance(v, Mapping):
        return {_json_key(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set | frozenset):
        return [_jsonable(x) for x in v]
    return repr(v)


def _json_key(k: Hashable) -> Any:
    return k if k is None or isinstance(k, str | int | float | bool) else repr(k)
