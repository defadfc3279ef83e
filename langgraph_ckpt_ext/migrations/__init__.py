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
also gives an empty state. For a step where that is not right, give `SchemaStep(values, writes)`,
whose `writes(channel, value)` returns the upgraded `(channel, value)` pairs.

The chain itself lives in `core.schema` (the saver applies it on every read) and is re-exported
here; this package adds the bulk rewrite of stored threads (`runner`, and the `Migrating` mixin
that puts `migrate_threads` on the backends' checkpointers).

May import: `core` only.
Layers, bottom to top: core -> state, migrations, timetravel -> backends -> connecting,
transfer -> strategies -> cli and the top-level package (`tests/core/test_layering.py`).
"""

from __future__ import annotations

from typing import Any

from ..core.errors import SchemaVersionError, renamed
from ..core.graph import is_reserved
from ..core.schema import (
    NAME_KEY,
    VERSION_KEY,
    SchemaChain,
    SchemaStep,
    Upcaster,
    WriteUpcaster,
    compare,
    stored_schema_name,
    stored_schema_version,
)

__all__ = [
    "NAME_KEY", "VERSION_KEY", "SchemaChain", "SchemaStep", "SchemaVersionError",
    "Upcaster", "WriteUpcaster", "compare", "is_reserved", "stored_schema_name",
    "stored_schema_version",
]


def __getattr__(name: str) -> Any:
    if name == "Step":  # the former name, still importable for a while
        return renamed("langgraph_ckpt_ext.migrations", "Step", SchemaStep)
    raise AttributeError(f"module 'langgraph_ckpt_ext.migrations' has no attribute {name!r}")
