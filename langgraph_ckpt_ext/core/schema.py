"""The state schema's version chain, as the saver applies it when it reads and stamps when it
writes (pure; no I/O): `SchemaChain`, its steps, and what a checkpoint's metadata says of the
schema it was stored under. `langgraph_ckpt_ext.migrations` documents it and adds the bulk
rewrite of stored threads (`migrate_threads`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import SchemaVersionError
from .graph import START, is_reserved

Values = dict[str, Any]
Upcaster = Callable[[Values], Values]
WriteUpcaster = Callable[[str, Any], Iterable[tuple[str, Any]]]

_NO_BASE = object()
START_CHANNEL = START
VERSION_KEY = "schema_version"
NAME_KEY = "schema_name"
"""The metadata keys a checkpointer with a chain stamps on each checkpoint it writes."""


@dataclass(frozen=True)
class SchemaStep:
    """An upcaster (`values`) with an explicit rule for pending writes (`writes`)."""

    values: Upcaster
    writes: WriteUpcaster | None = None


def compare(
    old: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(added, removed, changed) channels from `old` to `new` values, each sorted; a value the
    upgrade replaced counts as changed (upcasters return new objects for what they change)."""
    added = tuple(sorted(ch for ch in new if ch not in old))
    removed = tuple(sorted(ch for ch in old if ch not in new))
    changed = tuple(sorted(ch for ch in new if ch in old and new[ch] is not old[ch]))
    return added, removed, changed


class SchemaChain:
    """Upcasters keyed by the version they upgrade from, up to `current`.

    Args:
        current: the schema version the code writes.
        upcasters: `{n: f}` (or `(n, f)` pairs) where `f` turns values at version n into
            values at n + 1 (a function, or a `SchemaStep`); every version from the lowest to
            `current - 1` must have one.
        first: the oldest version data may be stored at (default: the lowest key, or `current`).
        name: what the chain owns, stamped with the version on every checkpoint written under
            it (a graph's or a state schema's name). Without one, threads are upgraded when
            read, and `migrate_threads` needs `include_unstamped=True`.
    """

    def __init__(
        self,
        current: int,
        upcasters: (Mapping[int, Upcaster | SchemaStep]
                    | Iterable[tuple[int, Upcaster | SchemaStep]] | None) = None,
        *,
        first: int | None = None,
        name: str | None = None,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise SchemaVersionError(
                f"a chain's name must be a non-empty string (a graph's name), got {name!r}"
            )
        pairs = list(upcasters.items() if isinstance(upcasters, Mapping) else upcasters or ())
        steps: dict[int, SchemaStep] = {}
        for version, fn in pairs:
            if version in steps:
                raise SchemaVersionError(
                    f"two upcasters from version {version}: keep one step per version"
                )
            steps[version] = fn if isinstance(fn, SchemaStep) else SchemaStep(fn)
        if not isinstance(current, int) or isinstance(current, bool) or current < 1:
            raise SchemaVersionError(f"current schema version must be an int >= 1, got {current!r}")
        for version, fn in steps.items():
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise SchemaVersionError(f"upcaster key {version!r} is not a version (an int >= 1)")
            if version >= current:
                raise SchemaVersionError(
                    f"upcaster from version {version} goes past the current version {current}: "
                    "raise `current`, or drop the step"
                )
            if not callable(fn.values) or not (fn.writes is None or callable(fn.writes)):
                raise SchemaVersionError(f"upcaster from version {version} is not callable")
        self.current = current
        self.name = name
        self.first = min(steps, default=current) if first is None else first
        missing = [v for v in range(self.first, current) if v not in steps]
        if missing:
            raise SchemaVersionError(
                f"the chain from version {self.first} to {current} has a gap: no upcaster from "
                f"version(s) {missing}"
            )
        self._steps = steps
        self._bases: dict[int, Any] = {}

    def __repr__(self) -> str:
        named = "" if self.name is None else f", name={self.name!r}"
        return f"SchemaChain(current={self.current}, first={self.first}{named})"

    def stamp(self) -> dict[str, Any]:
        """The metadata a checkpoint written under this chain carries."""
        return {VERSION_KEY: self.current, **({} if self.name is None else {NAME_KEY: self.name})}

    def owns(self, stored_name: str | None) -> bool:
        """Whether a checkpoint stamped with `stored_name` (None: no name) is this chain's to
        upgrade when read: unnamed ones are, as before names existed."""
        return stored_name is None or stored_name == self.name

    def check(self, stored: int) -> None:
        """Raise unless values stored at `stored` can be upgraded to `current`."""
        if stored > self.current:
            raise SchemaVersionError(
                f"stored state has schema version {stored}, newer than the {self.current} this "
                "code knows: deploy the newer code (versions never go down)"
            )
        if stored < self.first:
            raise SchemaVersionError(
                f"stored state has schema version {stored}, older than the oldest this chain "
                f"upgrades ({self.first}): add the upcasters from version {stored}"
            )

    def upgrade(self, values: Mapping[str, Any], stored: int) -> Values:
        """`values` stored at version `stored`, upgraded to `current` (a new dict; the input is
        not changed). Versions never go down: data newer than the code is refused. LangGraph's
        own channels pass through unchanged."""
        self.check(stored)
        out = {k: v for k, v in values.items() if not is_reserved(k)}
        for version in range(stored, self.current):
            out = self._step(version, out)
        if isinstance(out.get("schema_version"), int) and out["schema_version"] < self.current:
            out["schema_version"] = self.current  # a state that records its version (AgentState)
        for k, v in values.items():
            if k == START_CHANNEL and isinstance(v, dict) and stored < self.current:
                # The input a step was started with: an update of state channels, as a write is.
                v = {ch: x for key, val in v.items() for ch, x in self._input(key, val, stored)}
            if is_reserved(k):
                out[k] = v
        return out

    def _input(self, key: Any, value: Any, stored: int) -> list[tuple[Any, Any]]:
        if not isinstance(key, str) or is_reserved(key):
            return [(key, value)]
        return self.upgrade_write(key, value, stored)

    def _step(self, version: int, values: Values) -> Values:
        try:
            out = self._steps[version].values(dict(values))
        except Exception as exc:
            raise SchemaVersionError(
                f"upcaster from version {version} to {version + 1} failed: {exc!r}"
            ) from exc
        if not isinstance(out, dict):
            raise SchemaVersionError(
                f"upcaster from version {version} returned {type(out).__name__}, not a dict "
                "of channel values"
            )
        return out

    def upgrade_write(self, channel: str, value: Any, stored: int) -> list[tuple[str, Any]]:
        """One pending write stored at version `stored`, as the writes it is at `current`."""
        self.check(stored)
        pending = [(channel, value)]
        for version in range(stored, self.current):
            out: list[tuple[str, Any]] = []
            for ch, v in pending:
                out.extend([(ch, v)] if is_reserved(ch) else self._write_step(version, ch, v))
            pending = out
        return pending

    def _write_step(self, version: int, channel: str, value: Any) -> list[tuple[str, Any]]:
        step = self._steps[version]
        if step.writes is not None:
            try:
                return [(str(ch), v) for ch, v in step.writes(channel, value)]
            except Exception as exc:
                raise SchemaVersionError(
                    f"write upcaster from version {version} failed on a write to "
                    f"{channel!r}: {exc!r}"
                ) from exc
        full = self._step(version, {channel: value})
        if version not in self._bases:  # what the step fills in on its own
            try:
                self._bases[version] = step.values({})
            except Exception:
                self._bases[version] = _NO_BASE  # it needs its input: keep all it returns
        base = self._bases[version]
        return [
            (k, v) for k, v in full.items()
            if k == channel or not isinstance(base, dict) or k not in base or base[k] != v
        ]

    def needs(self, stored: int) -> bool:
        """Whether values stored at `stored` need upgrading (raises if they cannot be)."""
        self.check(stored)
        return stored < self.current


def stored_schema_name(metadata: Mapping[str, Any], checkpoint_id: str) -> str | None:
    """The chain name a checkpoint was stamped with (None: none)."""
    name = metadata.get(NAME_KEY)
    if name is not None and not isinstance(name, str):
        raise SchemaVersionError(
            f"checkpoint {checkpoint_id!r} has schema_name {name!r} in its metadata, not a string"
        )
    return name




def stored_schema_version(metadata: Mapping[str, Any], chain: SchemaChain, checkpoint_id: str) -> int:
    """The state-schema version a checkpoint was stored under (unstamped: the chain's first)."""
    version = metadata.get(VERSION_KEY, chain.first)
    if not isinstance(version, int) or isinstance(version, bool):
        raise SchemaVersionError(
            f"checkpoint {checkpoint_id!r} has schema_version {version!r} in its metadata, "
            "not an int"
        )
    return version


__all__ = [
    "NAME_KEY", "START_CHANNEL", "VERSION_KEY", "SchemaChain", "SchemaStep", "SchemaVersionError",
    "Upcaster", "Values", "WriteUpcaster", "compare", "is_reserved", "stored_schema_name",
    "stored_schema_version",
]
