"""Time travel over any `BaseCheckpointSaver`: history, inspect, diff, fork, replay, A/B forks,
lineage (and, on our checkpointers, a tamper-evident audit trail).

Every helper is one implementation over the saver interface, with a sync and an async form;
our checkpointers also offer them as methods (`checkpointer.history(thread_id)`, ...: the
`TimeTravel` and `Verifying` mixins of `methods`). The audit trail is sealed by the core on
every put (`core.audit`); `audit` here verifies it.

May import: `core` only.
Layers, bottom to top: core -> state, migrations, timetravel -> backends -> connecting,
transfer -> strategies -> cli and the top-level package (`tests/core/test_layering.py`).
"""

from ._base import CheckpointNotFoundError, ThreadExistsError, ThreadNotFoundError

# The functions `diff`/`adiff` (module `.diff`) are bound after their module is imported: the
# package's `diff` is the function, `timetravel.diff` the module only through `sys.modules`.
from .diff import adiff, diff
from .fork import ForkNode, afork, alineage, fork, lineage
from .history import (
    HistoryEntry,
    HistoryPage,
    Inspection,
    ahistory,
    ahistory_page,
    ainspect,
    history,
    history_page,
    inspect,
)
from .replay import (
    ABResult,
    Transition,
    Variant,
    VariantRun,
    aab_test,
    ab_test,
    areplay,
    arerun,
    replay,
    rerun,
)
from .statediff import StateDiff, diff_values

__all__ = [
    "ABResult",
    "CheckpointNotFoundError",
    "ForkNode",
    "HistoryEntry",
    "HistoryPage",
    "Inspection",
    "StateDiff",
    "ThreadExistsError",
    "ThreadNotFoundError",
    "Transition",
    "Variant",
    "VariantRun",
    "aab_test",
    "ab_test",
    "adiff",
    "afork",
    "ahistory",
    "ahistory_page",
    "ainspect",
    "alineage",
    "areplay",
    "arerun",
    "diff",
    "diff_values",
    "fork",
    "history",
    "history_page",
    "inspect",
    "lineage",
    "replay",
    "rerun",
]
