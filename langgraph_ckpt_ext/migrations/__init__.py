"""State-schema migration: a versioned chain of upcasters for stored channel values.

An upcaster is a plain function of a checkpoint's channel values at version N that returns them
at version N + 1 (a renamed field, a new field with its default, a changed message format). A
`SchemaChain` declares them once, checks that they form an unbroken chain from its first version
to the current one, and applies the steps a stored version needs:

    def v1_to_v2(values):
        values = dict(values)
        values["goal"] = values.pop("objective", "")
        return values

    chain = SchemaChain(current=2, upcasters={1: v1_to_v2})
    chain.upgrade({"objective": "x"}, stored=1)  # -> {"goal": "x"}, at version 2

Give the chain to a checkpointer (`SQLiteCheckpointer(path, schema_chain=chain)`, the same on
every backend) and it stamps each checkpoint it writes with `chain.current` (metadata
`schema_version`) and `chain.name` (`schema_name`), upgrades older checkpoints when they are
read, and rewrites stored threads on `migrate_threads()`.

The name says which threads the chain owns, where graphs with different state schemas share a
store: `SchemaChain(3, {...}, name="support")`. A checkpoint stamped with another name (any
name, for a chain without one) is never upgraded, on read or by `migrate_threads`. A
checkpoint with no name (written with no chain, by a release before names, or by an unnamed
chain) counts as the chain's own when read; eager migration takes such threads only when asked
(`include_unstamped=True`), and stamps them with the name then.

Upcasters see and return only the state's channels: LangGraph's own (`__start__`,
`__interrupt__`, `branch:to:node`, ...: a name starting with `__` or holding `:`) pass through
untouched, except the input a step was started with (`__start__`), which is upgraded as pending
writes are. A state field named `schema_version` (as `AgentState` has) is set to the current
version. Return new values rather than changing the given ones in place.

Pending writes (a step's writes not yet in a checkpoint: those of a thread paused at an
interrupt) are upgraded one at a time: by default the step's upcaster runs on `{channel: value}`
and the write becomes the channels it returns, minus those it only filled with the defaults it
also gives an empty state. For a step where that is not right, give `Step(values, writes)`,
whose `writes(channel, value)` returns the upgraded `(channel, value)` pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.errors import CheckpointerError

Values = dict[str, Any]
Upcaster = Callable[[Values], Values]
WriteUpcaster = Callable[[str, Any], Iterable[tuple[str, Any]]]

_NO_BASE = object()
START_CHANNEL = "__start__"
VERSION_KEY = "schema_version"
NAME_KEY = "schema_name"
"""The metadata keys a checkpointer with a chain stamps on each checkpoint it writes."""


def is_reserved(channel: str) -> bool:
    """LangGraph's own channels (`__start__`, `__interrupt__`, `branch:to:x`): never upgraded."""
    return channel.startswith("__") or ":" in channel


@dataclass(frozen=True)
class Step:
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


class SchemaVersionError(CheckpointerError, ValueError):
    """A chain that cannot be applied: a gap, a bad version, or stored data newer than the code."""


class SchemaChain:
    """Upcasters keyed by the version they upgrade from, up to `current`.

    Args:
        current: the schema version the code writes.
        upcasters: `{n: f}` (or `(n, f)` pairs) where `f` turns values at version n into
            values at n + 1 (a function, or a `Step`); every version from the lowest to
            `current - 1` must have one.
        first: the oldest version data may be stored at (default: the lowest key, or `current`).
        name: what the chain owns, stamped with the version on every checkpoint written under
            it (a graph's or a state schema's name). Without one, threads are upgraded when
            read, and `migrate_threads` needs `include_unstamped=True`.
    """

    def __init__(
        self,
        current: int,
        upcasters: Mapping[int, Upcaster | Step] | Iterable[tuple[int, Upcaster | Step]] | None = None,
        *,
        first: int | None = None,
        name: str | None = None,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise SchemaVersionError(
                f"a chain's name must be a non-empty string (a graph's name), got {name!r}"
            )
        pairs = list(upcasters.items() if isinstance(upcasters, Mapping) else upcasters or ())
        steps: dict[int, Step] = {}
        for version, fn in pairs:
            if version in steps:
                raise SchemaVersionError(
                    f"two upcasters from version {version}: keep one step per version"
                )
            steps[version] = fn if isinstance(fn, Step) else Step(fn)
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


__all__ = [
    "NAME_KEY", "VERSION_KEY", "SchemaChain", "SchemaVersionError", "Step", "Upcaster",
    "WriteUpcaster", "compare", "is_reserved", "stored_schema_name",
]
