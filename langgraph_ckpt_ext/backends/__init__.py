"""Backends: in-memory, SQLite, PostgreSQL and Redis. Each moves rows for the core saver (its
`Store`), nothing more, and names its public class over `checkpointer.Checkpointer`: the core
`StoreCheckpointer` with the time-travel, `verify` and `migrate_threads` methods of the layers
below this one. Each backend is imported only when named (its driver with it).

May import: `core`, `migrations`, `timetravel`.
Layers, bottom to top: core -> state, migrations, timetravel -> backends -> connecting,
transfer -> strategies -> cli and the top-level package (`tests/core/test_layering.py`).
"""
