"""`AgentState`: an agent's state as a LangGraph state schema, each field a channel with its
reducer, and typed models for its parts.

    builder = StateGraph(AgentState)

Nodes return partial updates, as with any LangGraph state: `{"tokens_used": 120}` adds 120 to
the total, `{"messages": [ai]}` appends (a message whose id is already there replaces it rather
than being added twice), `{"working_memory": wm}` replaces the previous one.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.messages import AnyMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.graph.message import add_messages
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer

Status = Literal["running", "paused", "completed", "failed", "awaiting_human"]
SHORT_TERM_LIMIT = 50
"""How many entries `short_term_memory` keeps (the newest)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanStep(_Model):
    """One step of the agent's plan."""

    id: str
    description: str
    status: Literal["pending", "running", "done", "failed", "skipped"] = "pending"
    result: str | None = None


class ToolSpec(_Model):
    """A tool the agent may call; `side_effects` marks one whose call changes the world."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    side_effects: bool = False


class ToolCall(_Model):
    """One call of a tool and its outcome."""

    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    error: str | None = None
    started_at: datetime | None = None
    duration_ms: float | None = None


class MemoryRef(_Model):
    """A pointer to long-term memory (a document, a vector, a record): its id, not its content."""

    id: str
    kind: str = "document"
    score: float | None = None


class WorkingMemory(_Model):
    """What the agent keeps in mind for the task at hand."""

    scratchpad: str = ""
    facts: dict[str, Any] = Field(default_factory=dict)
    updated_at: datetime | None = None


# -- reducers ------------------------------------------------------------------------------------


def latest(old: Any, new: Any) -> Any:
    """The newest write wins (unlike a plain field, several writes in one step are allowed)."""
    return new


def first(old: Any, new: Any) -> Any:
    """The first value stays (a start time)."""
    return new if old is None else old


def _items(new: Any) -> list[Any]:
    return list(new) if isinstance(new, list | tuple) else [new]


def append(old: Sequence[Any] | None, new: Any) -> list[Any]:
    """Append: a list extends, a single item is added."""
    return [*(old or []), *_items(new)]


def merge_by_id(old: Sequence[Any] | None, new: Any) -> list[Any]:
    """Append items whose `id` is new; an item with a known id replaces the stored one."""
    out = list(old or [])
    where = {item.id: i for i, item in enumerate(out)}
    for item in _items(new):
        if item.id in where:
            out[where[item.id]] = item
        else:
            where[item.id] = len(out)
            out.append(item)
    return out


def recent(old: Sequence[Any] | None, new: Any) -> list[Any]:
    """Append, keeping the newest `SHORT_TERM_LIMIT` entries."""
    return append(old, new)[-SHORT_TERM_LIMIT:]


class AgentState(TypedDict, total=False):
    """The agent state of langgraph-ckpt-ext, for `StateGraph(AgentState)`.

    Identity: `thread_id`, `agent_id`, `user_id`. Task: `goal`, `plan`, `current_step`.
    Conversation: `messages` (LangGraph's `add_messages`). Memory: `working_memory` (the latest
    wins), `short_term_memory` (the newest 50 notes), `long_term_refs` (ids, merged by id).
    Tools: `available_tools`, `tool_call_history` (appended). Execution: `iterations`,
    `tokens_used`, `cost_usd` (summed), `start_time` (the first one stays). Control: `status`,
    `schema_version`.
    """

    thread_id: str
    agent_id: str
    user_id: str
    goal: str
    plan: Annotated[list[PlanStep] | None, latest]
    current_step: Annotated[int, latest]
    messages: Annotated[list[AnyMessage], add_messages]
    working_memory: Annotated[WorkingMemory, latest]
    short_term_memory: Annotated[list[str], recent]
    long_term_refs: Annotated[list[MemoryRef], merge_by_id]
    available_tools: Annotated[list[ToolSpec], latest]
    tool_call_history: Annotated[list[ToolCall], append]
    iterations: Annotated[int, operator.add]
    tokens_used: Annotated[int, operator.add]
    cost_usd: Annotated[float, operator.add]
    start_time: Annotated[datetime, first]
    status: Annotated[Status, latest]
    schema_version: Annotated[int, latest]


def _read_only(value: Any) -> Any:
    """`value` with its dicts as read-only mappings and its lists as tuples, all the way down."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _read_only(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_read_only(v) for v in value)
    return value


def _plain(value: Any) -> Any:
    """What `_read_only` froze, as dicts and lists again (for `model_dump`)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


ReadOnlyMetadata = Annotated[
    Mapping[str, Any], AfterValidator(_read_only), PlainSerializer(_plain)
]


class AgentSnapshot(BaseModel):
    """A thread's `AgentState` read back, typed, with where and when it was checkpointed.

    `schema_version` is the state-schema version the checkpoint's metadata carries (stamped by
    a checkpointer with a `SchemaChain`, and the version the state is read at); without one,
    the state's own `schema_version`, else 1. `checkpointer_metadata` is the checkpoint's
    metadata (`source`, `step`, `parents`, `schema_version`, `schema_name`, what the run's
    config added), read-only: the field cannot be reassigned, its mappings not changed.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    thread_id: str | None = None
    agent_id: str | None = None
    user_id: str | None = None
    goal: str | None = None
    plan: list[PlanStep] | None = None
    current_step: int = 0
    messages: list[AnyMessage] = Field(default_factory=list)
    working_memory: WorkingMemory = Field(default_factory=WorkingMemory)
    short_term_memory: list[str] = Field(default_factory=list)
    long_term_refs: list[MemoryRef] = Field(default_factory=list)
    available_tools: list[ToolSpec] = Field(default_factory=list)
    tool_call_history: list[ToolCall] = Field(default_factory=list)
    iterations: int = 0
    tokens_used: int = 0
    cost_usd: float = 0.0
    start_time: datetime | None = None
    status: Status = "running"
    schema_version: int = 1
    checkpoint_id: str
    last_checkpoint: datetime
    """When the checkpoint read was written (the checkpoint's `ts`, UTC)."""
    checkpointer_metadata: ReadOnlyMetadata = Field(
        default_factory=lambda: MappingProxyType({}), frozen=True
    )


def _snapshot(tup: CheckpointTuple | None) -> AgentSnapshot | None:
    if tup is None:
        return None
    ckpt = tup.checkpoint
    fields = {k: v for k, v in ckpt["channel_values"].items() if k in AgentSnapshot.model_fields}
    when = datetime.fromisoformat(str(ckpt["ts"]))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    version = (tup.metadata or {}).get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool):
        fields["schema_version"] = version  # the version the values were stored or read at
    return AgentSnapshot(**fields, checkpoint_id=str(ckpt["id"]), last_checkpoint=when,
                         checkpointer_metadata=tup.metadata or {})


def load_agent_state(
    checkpointer: BaseCheckpointSaver[Any], config: RunnableConfig
) -> AgentSnapshot | None:
    """The thread's state at `config` (its newest checkpoint without a `checkpoint_id`), typed;
    None for a thread with no checkpoint."""
    return _snapshot(checkpointer.get_tuple(config))


async def aload_agent_state(
    checkpointer: BaseCheckpointSaver[Any], config: RunnableConfig
) -> AgentSnapshot | None:
    """Async twin of `load_agent_state`."""
    return _snapshot(await checkpointer.aget_tuple(config))
