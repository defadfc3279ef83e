"""Imported by the fork server of `tests.support.fresh` before it forks any worker: what the
workers import, and nothing opened (no checkpointer, connection, thread or event loop)."""

from __future__ import annotations

import gc

import langgraph_ckpt_ext
import langgraph_ckpt_ext.backends.memory
import langgraph_ckpt_ext.backends.postgres
import langgraph_ckpt_ext.backends.redis
import langgraph_ckpt_ext.backends.sqlite  # noqa: F401
import tests.support.diff_graphs
import tests.support.writers  # noqa: F401

# What is imported now is never garbage: a worker's shutdown then leaves it alone instead of
# walking (and so copying, page by page) the whole inherited heap.
gc.freeze()
