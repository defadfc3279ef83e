"""What a command prints: aligned tables or JSON on stdout, progress and errors on stderr.

Colour is used only on a terminal, and never when `NO_COLOR` is set (https://no-color.org) or
`--no-color` is given. In JSON mode stdout holds one JSON document: a table is printed as a
JSON array of its rows, text lines go to stderr, and no progress is drawn.

Thread ids and stored values come from whoever wrote the store: every piece of text printed
goes through `printable`, so that none can move the cursor, clear the screen or start a line
of its own; JSON escapes the same characters, its values kept exact.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import threading
import time
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from types import TracebackType
from typing import IO, Any

from ..core.urls import mask

_BOLD = "\033[1m"
_RESET = "\033[0m"
_GREEN, _YELLOW, _RED = "\033[32m", "\033[33m", "\033[31m"
# The first word of a status cell -> its colour.
_STATUS_COLOR = {
    "done": _GREEN, "intact": _GREEN, "ok": _GREEN, "removed": _GREEN, "migrated": _GREEN,
    "current": _GREEN,
    "running": _YELLOW, "awaiting": _YELLOW, "skipped": _YELLOW, "would": _YELLOW,
    "kept": _YELLOW, "not": _YELLOW,
    "error": _RED, "failed": _RED, "altered": _RED, "missing": _RED, "broken": _RED,
}


# Characters a terminal acts on or does not show: controls (C0, DEL, C1), format characters
# (bidi overrides, zero-width ones), lone surrogates (not even encodable), line separators.
_HIDDEN = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NOT_ASCII = re.compile(r"[^\x00-\x7e]")  # what json.dumps(ensure_ascii=False) leaves raw


def printable(text: str) -> str:
    """`text` with each character a terminal would act on or hide written as Python escapes it
    (`\\x1b`, `\\n`, `\\u202e`); the rest, any script or emoji, as it is."""
    if text.isprintable():  # the common case: nothing to look at
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in _HIDDEN else ch for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _json_safe(match: re.Match[str]) -> str:
    """A character of a JSON document as a JSON escape if a terminal would act on it."""
    ch = match.group()
    if unicodedata.category(ch) not in _HIDDEN:
        return ch
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a surrogate pair, as JSON writes characters beyond the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def jsonable(value: Any) -> Any:
    """`value` as plain JSON types: pydantic models (messages included) dumped, dataclasses as
    dicts, dates in ISO 8601, bytes as text where they decode, anything else as its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return repr(value)
    dump = getattr(value, "model_dump", None)  # pydantic: LangChain messages, our models
    if callable(dump):
        try:
            return jsonable(dump(mode="json"))
        except Exception:  # a field pydantic cannot serialize
            return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)


def _key(k: Any) -> str:
    return k if isinstance(k, str) else json.dumps(jsonable(k))


def human_bytes(n: int) -> str:
    """`n` bytes for a reader: `512 B`, `12.3 KiB`, `4.0 MiB`."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def cell(column: str, value: Any) -> str:
    """How a table shows a value: `-` for none, sizes (a column named `bytes` or ending in
    `_bytes`) humanized, times to the second, lists comma-separated, statuses with spaces,
    other values as JSON (`{"a": null}`)."""
    if value is None or value == "":
        return "-"
    if (column == "bytes" or column.endswith("_bytes")) and isinstance(value, int):
        return human_bytes(value)
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(cell("", v) for v in value) or "-"
    if column == "status":
        return printable(str(value).replace("_", " "))
    if isinstance(value, str | int | float):
        return printable(str(value))
    plain = jsonable(value)  # a dict, a date, a model: JSON-like, not a Python repr
    return printable(plain if isinstance(plain, str) else json.dumps(plain, ensure_ascii=False))


class Progress:
    """A progress bar on stderr, drawn at most ten times a second; `update(n)` counts `n` more
    items. Silent when `draw` is False. `total` may be set once it is known."""

    def __init__(self, stream: IO[str], total: int | None, label: str, draw: bool,
                 lock: threading.Lock | None = None) -> None:
        self.total = total
        self.done = 0
        self._stream = stream
        self._label = printable(label)
        self._draw = draw
        self._shown = 0.0
        self._open = False  # the bar is drawn and the cursor stands at its end
        self._lock = lock or threading.Lock()  # Output's: its messages come from any thread

    def __enter__(self) -> Progress:
        self._render(force=True)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._draw:
            self._render(force=True)
            with self._lock:
                self.end_line()

    def update(self, n: int = 1) -> None:
        self.done += n
        self._render()

    def end_line(self) -> None:
        """End the bar's line, so that a message printed now starts a line of its own (the
        bar is drawn again, below it, at the next update). Called holding the lock."""
        if self._open:
            self._stream.write("\n")
            self._stream.flush()
            self._open = False

    def _render(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self._draw or (not force and now - self._shown < 0.1):
            return
        self._shown = now
        if self.total:
            width = 30
            filled = min(width, width * self.done // self.total)
            bar = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
        else:
            bar = str(self.done)
        with self._lock:
            self._stream.write(f"\r{self._label} {bar}")
            self._stream.flush()
            self._open = True


class Output:
    """Where a command's results go.

    Args:
        json_mode: print JSON (tables as arrays of rows) instead of text.
        color: colour headers and statuses; None: only when stdout is a terminal and
            `NO_COLOR` is unset.
    """

    def __init__(
        self, json_mode: bool, color: bool | None, *, stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
    ) -> None:
        self.json_mode = json_mode
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        if color is None:
            color = _is_tty(self.stdout) and "NO_COLOR" not in os.environ
        self.color = color and not json_mode
        self._secrets: list[str] = []
        self._bar: Progress | None = None
        self._lock = threading.Lock()

    def hide(self, secrets: Iterable[str]) -> None:
        """Never print these on stderr (passwords): each is shown as `***`."""
        self._secrets = sorted({*self._secrets, *secrets})

    def table(self, rows: list[dict[str, Any]], columns: list[str]) -> None:
        """Rows as aligned columns under a header (JSON mode: the rows, whole, as an array)."""
        if self.json_mode:
            self.json(rows)
            return
        if not rows:
            self.line("(none)")
            return
        heads = [c.replace("_", " ").upper() for c in columns]
        cells = [[cell(c, r.get(c)) for c in columns] for r in rows]  # escaped already
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(heads)]
        head = "  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()
        self._emit(self.stdout, self._paint(head, _BOLD), escape=False)
        for r in cells:
            parts = []
            for c, text, w in zip(columns, r, widths, strict=True):
                padded = text.ljust(w)
                if c == "status":
                    padded = self._paint(text, _STATUS_COLOR.get(text.split(" ")[0], "")) + (
                        " " * (w - len(text)))
                parts.append(padded)
            self._emit(self.stdout, "  ".join(parts).rstrip(), escape=False)

    def json(self, obj: Any) -> None:
        """`obj` as indented JSON on stdout (see `jsonable` for what it turns values into);
        characters a terminal would act on are written as JSON escapes."""
        text = json.dumps(jsonable(obj), indent=2, ensure_ascii=False)
        self.stdout.write(_NOT_ASCII.sub(_json_safe, text) + "\n")
        self.stdout.flush()

    def line(self, text: str = "") -> None:
        """A line of text: on stdout, or on stderr in JSON mode (stdout holds only JSON).
        A newline in `text` is shown escaped, as any control character."""
        self._emit(self.stderr if self.json_mode else self.stdout, text)

    def lines(self, text: str) -> None:
        """Text of several lines, one `line` each."""
        for part in text.split("\n"):
            self.line(part)

    def note(self, text: str) -> None:
        """A line on stderr, whatever the mode (when stdout holds a command's data)."""
        self._emit(self.stderr, text)

    def progress(self, total: int | None, label: str) -> Progress:
        """A context manager: a progress bar on stderr, drawn only when stderr is a terminal
        and not in JSON mode; `.update(n=1)` as items complete."""
        draw = not self.json_mode and _is_tty(self.stderr)
        self._bar = Progress(self.stderr, total, label, draw, self._lock)
        return self._bar

    def error(self, message: str) -> None:
        """One line on stderr: `lgckpt: error: message`."""
        self._emit(self.stderr, f"lgckpt: error: {self._one_line(message)}")

    def warn(self, message: str) -> None:
        """One line on stderr: `lgckpt: warning: message`."""
        self._emit(self.stderr, f"lgckpt: warning: {self._one_line(message)}")

    def _one_line(self, message: str) -> str:
        # the secrets first: a password may hold spaces, which the join would change
        return " ".join(self._scrub(str(message)).split())

    def _scrub(self, text: str) -> str:
        return mask(text, self._secrets) if self._secrets else text

    def _emit(self, stream: IO[str], text: str, *, escape: bool = True) -> None:
        if stream is self.stderr:
            text = self._scrub(text)
        text = printable(text) if escape else text
        with self._lock:
            if stream is self.stderr and self._bar is not None:
                self._bar.end_line()
            stream.write(text + "\n")
            stream.flush()

    def _paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.color and code and text else text


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
