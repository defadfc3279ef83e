"""Worker processes for the cross-process tests: new processes that share nothing with the
test process but what is handed to them (the storage's name, synchronization primitives).

They come from multiprocessing's fork server, started once per test process with the package
and the tests' support modules imported (`tests.support.preload`): a worker forks from it
instead of importing LangGraph afresh (about a second and a half each), and opens its own
checkpointers, connections and event loops, as a "spawn" worker does. (`tests.support.forked`
does the same for `python -m` workers, which multiprocessing cannot start.)
"""

from __future__ import annotations

import multiprocessing

PROCESSES = multiprocessing.get_context("forkserver")
PROCESSES.set_forkserver_preload(["tests.support.preload"])
