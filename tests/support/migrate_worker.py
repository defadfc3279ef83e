"""Run in a separate process by test_migration_kill.py: migrates every thread of a store to
the v3 schema, one thread at a time, printing progress (and pausing after each thread, so
that the test can kill it halfway)."""

from __future__ import annotations

import sys
import time
from typing import Any

from langgraph_ckpt_ext import connect
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.migrations.runner import MigrationProgress
from tests.support.savers import PG_DSN, REDIS_URL
from tests.support.schema_graphs import CHAIN


def open_target(target: str, **options: Any) -> StoreCheckpointer:
    """`sqlite:<path>`, `postgres:<schema>` or `redis:<key prefix>`."""
    kind, _, rest = target.partition(":")
    if kind == "postgres":
        return connect(PG_DSN, schema=rest, **options)
    if kind == "redis":
        return connect(REDIS_URL, key_prefix=rest, **options)
    return connect(f"sqlite:///{rest}", **options)


def main(target: str, pause: str) -> None:
    def progress(p: MigrationProgress) -> None:
        print(f"PROGRESS {p.threads_done} {p.threads_total}", flush=True)
        time.sleep(float(pause))

    saver = open_target(target, schema_chain=CHAIN)
    report = saver.migrate_threads(progress=progress, concurrency=1)
    print(f"DONE {report.checkpoints_migrated}", flush=True)
    saver.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
