"""A checkpoint where the graph waited for a human, as it was while it waited (pure; no I/O).

LangGraph keeps a step's log of task writes on the checkpoint the step started from, and adds
to it when the step goes on after a `Command(resume=...)`:

- a task that asked stores its question under `__interrupt__` (one slot per task: the latest
  question) and, once answered, the answers it consumed under `__resume__` (a list, in the
  order it asked);
- the `Command` itself is stored under the null task id (its `resume` value as `__resume__`,
  its `update` and `goto` as channel writes);
- a task that finished has at least one output write (any channel but those control ones).

Reopening keeps the question of every task that asked and then finished, and drops what its
answer produced: its output, its last answer, and the `Command` writes. The answers to its
earlier questions stay (a node that asked twice waits at its second question again). Tasks that
asked nothing keep their writes: they finished without reading an answer (parallel branches).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from langgraph.checkpoint.base import PendingWrite

from ..core.graph import (
    ERROR,
    ERROR_SOURCE_NODE,
    INTERRUPT,
    NULL_TASK_ID,
    RESUME,
)

# Writes that say what happened to a task; every other write is its output.
_CONTROL = frozenset({ERROR, ERROR_SOURCE_NODE, INTERRUPT, RESUME})


def asked(writes: Iterable[PendingWrite]) -> set[str]:
    """The tasks that asked a question (waited at `interrupt()`) at this checkpoint."""
    return {task_id for task_id, channel, _ in writes if channel == INTERRUPT}


def answered(writes: Sequence[PendingWrite]) -> set[str]:
    """The tasks that asked, were answered and finished."""
    done = {t for t, channel, _ in writes if t != NULL_TASK_ID and channel not in _CONTROL}
    return asked(writes) & done


def reopen(writes: Sequence[PendingWrite]) -> list[PendingWrite]:
    """`writes` as they were while every answered task waited at its last question; unchanged
    when no task was answered and ran on."""
    reopened = answered(writes)
    if not reopened:
        return list(writes)
    out: list[PendingWrite] = []
    for task_id, channel, value in writes:
        if task_id == NULL_TASK_ID:
            continue  # the Command that answered
        if task_id not in reopened or channel == INTERRUPT:
            out.append((task_id, channel, value))
        elif channel == RESUME and (earlier := _earlier_answers(value)):
            out.append((task_id, channel, earlier))
    return out


def _earlier_answers(value: Any) -> list[Any]:
    """A task's stored answers but its last one (LangGraph stores a list, or one value)."""
    return list(value[:-1]) if isinstance(value, list) else []
