"""Moving threads between checkpointers: compare, copy, export, import.

Works on any `BaseCheckpointSaver` through LangGraph's own read and write API (`list`, `put`,
`put_writes`), so a thread moves between any two of our backends, from LangGraph's official
savers (`open_official`), and through a JSON Lines file (`export_threads` / `import_jsonl`).

A thread is compared by checkpoint ids and content hashes (values, metadata, pending writes),
never by how a backend stores it. A copy writes checkpoints oldest first (a parent before its
children), each with the channel versions that changed since its parent, so that the target
stores each value once; into one of our checkpointers it writes a whole thread in one batch
(one transaction, statement or script), so a copy cut short never leaves half a thread.

    from langgraph_ckpt_ext import connect
    from langgraph_ckpt_ext.transfer import copy_threads, open_official

    with open_official("sqlite:///langgraph.db") as source:
        report = copy_threads(source, connect("postgresql://localhost/app"))
    print(report.summary())

May import: `core`, `state`, `migrations`, `timetravel`, `backends`, `connecting` (a wrapper's
repair in `strategies` uses it, so never `strategies`).
Layers, bottom to top: core -> state, migrations, timetravel -> backends -> connecting,
transfer -> strategies -> cli and the top-level package (`tests/core/test_layering.py`).
"""

from .copy import CopyReport, Progress, acopy_threads, copy_threads
from .jsonl import (
    FORMAT,
    FORMAT_VERSION,
    ExportReport,
    MalformedExportError,
    export_header,
    export_threads,
    import_jsonl,
    open_jsonl,
)
from .official import open_official
from .threads import (
    BATCH_SIZE,
    Missing,
    ThreadDiff,
    checkpoint_hash,
    checkpoint_key,
    diff_thread,
    named_threads,
    put_thread,
    thread_ids,
    thread_tuples,
    writes_hashes,
)

__all__ = [
    "BATCH_SIZE",
    "FORMAT",
    "FORMAT_VERSION",
    "CopyReport",
    "ExportReport",
    "MalformedExportError",
    "Missing",
    "Progress",
    "ThreadDiff",
    "acopy_threads",
    "checkpoint_hash",
    "checkpoint_key",
    "copy_threads",
    "diff_thread",
    "export_header",
    "export_threads",
    "import_jsonl",
    "named_threads",
    "open_jsonl",
    "open_official",
    "put_thread",
    "thread_ids",
    "thread_tuples",
    "writes_hashes",
]
