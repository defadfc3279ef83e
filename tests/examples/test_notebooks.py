"""Every notebook in notebooks/ runs top to bottom in a kernel of this very interpreter."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
kernelspec = pytest.importorskip("ipykernel.kernelspec")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

# Lines each notebook must print, besides running without an error.
EXPECTED = {
    "01_quickstart.ipynb": [
        "awaiting approval of: {'action'",
        "resumed the thread: approved",
        "fork: rejected - Final answer: nothing deleted; the disk is still full.",
        "ticket-42       status=approved  Final answer: the disk has room again.",
        "ticket-42-fork  status=rejected  Final answer: nothing deleted; the disk is still full.",
        "| finish |",
        "nodes: ['plan', 'act', 'finish']",
        "ticket-42: 29 rows,",
    ],
    "02_schema_migration.ipynb": [
        "order-17 read as schema version 3",
        "resumed under v3: Human said: approved (normal priority)",
        "skipped 1 thread(s) of other chains: invoice-3 ('billing')",
        "skipped 1 unstamped thread(s) (include_unstamped=True, --include-unstamped, migrates "
        "them): order-17",
        "threads: 3 / 3",
        "invoice-3 untouched: still schema 1 of 'billing'",
        "second run: 0 checkpoint(s) migrated",
        "refused: the chain from version 1 to 4 has a gap: no upcaster from version(s) [2]",
        "refused: stored state has schema version 3, newer than the 2 this code knows",
    ],
    "03_time_travel.ipynb": [
        "page 3: steps [-1]",
        "planner wrote tool='weather'",
        '+ tool:  "weather"',
        "fixed: You will earn 135.00 EUR.",
        "source still answers: The forecast: sunny and 24 C in Lisbon.",
        "whole_words  You will earn 135.00 EUR.",
        "A/B variant 'whole_words' forked from shift-pay at step 0",
        "fork waits at: pay out 135.00 EUR?",
        "fork said no: held the payment",
        "yes   paid 135.00 EUR   payments: 1",
        "no    held the payment  payments: 0",
        "payments in all: 2 (the source's and the 'yes' arm's)",
    ],
    "04_agent_state.ipynb": [
        "tokens_used        add",
        "long_term_refs     merge_by_id",
        "status: completed | iterations: 4 | tokens_used: 1070 | cost_usd: 0.0107",
        "long_term_refs: [('doc-7', 0.83), ('doc-2', 0.55), ('doc-9', 0.4)]",
        "messages: [('HumanMessage', 'q'), ('AIMessage', 'answer')]",
        "step 2 | status: running | tokens_used: 420 | tool calls: 1",
        "other process: completed 1070 tokens, 2 tool calls, last: search_papers",
        "other process, a thread never run: None",
        "tokens_used per checkpoint: [0, 0, 120, 420, 820, 1070, 1070]",
    ],
    "05_smart_save.ipynb": [
        "OnEvents, read-only lookup  handed over 50 checkpoints + 40 writes; 10 batch(es); "
        "stored 50 checkpoints",
        "Periodic(60)                handed over 50 checkpoints + 40 writes;  1 batch(es); "
        "stored 50 checkpoints",
        "bare checkpointer: 9.0 store calls per turn",
        "child: PAUSED at: refund order A-17? | batches written: 1, items buffered: 0",
        "child killed by signal 9",
        "fresh process finds: ('refund',) waiting at 'refund order A-17?'",
        "answers before the crash: 3",
        "resumed: Refund of A-17: yes. | refunded: ['A-17']",
        "stored: Refund of A-17: yes. | next: ()",
    ],
    "06_replication.ipynb": [
        "replica up: False | operations queued for it: True",
        "after the restart: up True | needs repair: True | threads to repair: ",
        "after repair(): up True | queued: 0 | needs repair: False",
        "every thread the same on both stores: True",
        "a second repair finds nothing to do: True",
        "primary file left: False",
        "replica finds ticket waiting at: ship order 5?",
        "resumed on the replica: human said yes | turns: 1",
        "as on the lost primary: True",
    ],
    "07_audit_trail.ipynb": [
        "status: intact",
        "the agent now reads: Please refund order 7: 2000 EUR.",
        "after tampering: altered, 8 of 9 checkpoints",
        "step -1  intact",
        "step  0  altered",
        "invoice-9: missing_parent",
        "invoice-9  8        failed (missing parent): 1 problem(s)",
        "lgckpt verify exit code: 6",
        "unkeyed, deleted and rewritten: intact",
        "keyed: intact, sealed under {'audit-2026-12': 9}",
        "keyed, rewritten without the key: unkeyed",
        "keyed, rewritten with a guessed key: altered",
    ],
    "08_postgres_redis.ipynb": [
        "postgres: PostgresCheckpointer paused before ('confirm',)",
        "resumed on postgres: refunded",
        "redis: RedisCheckpointer paused before ('confirm',)",
        "resumed on redis: refunded",
        "postgres status=refunded  messages=9  checkpoints=13",
        "redis    status=refunded  messages=9  checkpoints=13",
        "same conversation on both: True",
        "refreshed on write: True",
        "keys left after the deadline: 0",
        "thread after expiry: None",
        "- left: (0, 0)",
    ],
    "09_moving_off_langgraph_savers.ipynb": [
        "ticket-1: paused before ('confirm',)",
        "2 threads copied (72 checkpoints, 76 writes), 0 already there, 2 verified",
        "lgckpt import exit code: 0",
        "from PostgresSaver: 1 thread(s), 36 checkpoints, 38 writes copied; read back equal: True",
        "from InMemorySaver: 1 thread(s), 36 checkpoints, 38 writes copied; read back equal: True",
        "ticket-1: 36 checkpoints in SQLiteCheckpointer, history equal: True",
        "ticket-2: 36 checkpoints in SQLiteCheckpointer, history equal: True",
        "ticket-3: 36 checkpoints in PostgresCheckpointer, history equal: True",
        "ticket-4: 36 checkpoints in PostgresCheckpointer, history equal: True",
        "answered 'approve': refunded, next=()",
        "ticket-2: asked {'refund': 'Bo: please refund order 7.'}, answered 'reject': refused",
        "schema(s) and lgckpt-moving-",
        "- left: 0\n",
    ],
}


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A kernelspec running `sys.executable`, found before any user or system one."""
    prefix = tmp_path_factory.mktemp("jupyter")
    kernelspec.install(kernel_name="lgckpt-test", prefix=str(prefix))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
        yield "lgckpt-test"


def _printed(nb: nbformat.NotebookNode) -> str:
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.output_type == "stream"
    )


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_runs(path: Path, kernel_name: str) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('kernel prefix:', sys.prefix)"))
    client = nbclient.NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=120,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on an error

    printed = _printed(nb)
    assert f"kernel prefix: {sys.prefix}\n" in printed
    missing = [line for line in EXPECTED.get(path.name, []) if line not in printed]
    assert not missing, f"missing {missing!r} from what the notebook printed:\n{printed}"
