"""The serializers a checkpointer stores and loads with: LangGraph's, made strict (a stored row
may construct only allowlisted classes)."""

from __future__ import annotations

import copy

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .errors import InvalidConfigError

# The typed parts of our `AgentState` (frozen pydantic models, extra fields refused): always
# safe to construct, wherever LangGraph's schema walk misses them (an Annotated reducer field).
# Named, not imported: `state` is a layer above the core.
_OWN_TYPES = tuple(
    ("langgraph_ckpt_ext.state", name)
    for name in ("PlanStep", "ToolSpec", "ToolCall", "MemoryRef", "WorkingMemory")
)


def strict_serde() -> SerializerProtocol:
    """LangGraph's serializer, strict: a stored blob may construct only LangGraph's safe types,
    the typed parts of our `AgentState`, and the types the graph's state schema allows (LangGraph
    adds those when the graph compiles)."""
    return JsonPlusSerializer(allowed_msgpack_modules=_OWN_TYPES)


def loading_serde(
    serde: SerializerProtocol | None, *, unsafe_allow_any_class: bool = False
) -> SerializerProtocol:
    """The serializer a checkpointer stores and loads with: `serde` (default `strict_serde()`)
    made strict, whatever it was built with.

    A `JsonPlusSerializer` (or subclass), alone or inside `EncryptedSerializer`s, is replaced
    by a copy whose stored bytes may construct only LangGraph's safe types, the typed parts of
    our `AgentState`, the classes of its own explicit `allowed_msgpack_modules` and
    `allowed_json_modules`, and those LangGraph adds for the graph's state schema. Without
    this, LangGraph's `JsonPlusSerializer()` constructs any class a stored row names (unless
    `LANGGRAPH_STRICT_MSGPACK` is set), and an `EncryptedSerializer` hands it rows stored
    without encryption. Refused with `InvalidConfigError`, as no allowlist makes them safe:
    `pickle_fallback=True` (a stored pickle runs any code), a custom `__unpack_ext_hook__`,
    and serializers of other kinds (what they build from stored bytes is theirs to decide).

    `unsafe_allow_any_class=True` takes `serde` as it is: whoever can write to the storage may
    then run code in this process, as LangGraph's savers allow by default.
    """
    if serde is None:
        return strict_serde()
    return serde if unsafe_allow_any_class else _strict(serde)


def _strict(serde: SerializerProtocol) -> SerializerProtocol:
    if isinstance(serde, EncryptedSerializer):
        inner = _strict(serde.serde)
        if inner is serde.serde:
            return serde
        clone = copy.copy(serde)  # the caller's serializer is theirs: never changed
        clone.serde = inner
        return clone
    if isinstance(serde, JsonPlusSerializer):
        return _strict_jsonplus(serde)
    raise _cannot_be_strict(f"a {type(serde).__name__}: only LangGraph's JsonPlusSerializer, or "
                            "an EncryptedSerializer over one, is made strict here")


def _cannot_be_strict(what: str) -> InvalidConfigError:
    return InvalidConfigError(
        f"serde is {what}; loading could construct any class a stored row names. Pass "
        "unsafe_allow_any_class=True (lgckpt: --unsafe-allow-any-class) to use it anyway, "
        "trusting whoever can write to the storage"
    )


def _strict_jsonplus(serde: JsonPlusSerializer) -> JsonPlusSerializer:
    """`serde`, or a copy of it, loading only allowlisted classes (its own list kept)."""
    if serde.pickle_fallback:
        raise _cannot_be_strict("JsonPlusSerializer(pickle_fallback=True): a stored pickle runs "
                                "any code")
    if getattr(serde, "_custom_unpack_ext_hook", False):
        raise _cannot_be_strict("a JsonPlusSerializer with its own __unpack_ext_hook__")
    # LangGraph's private settings, read only: its constructor sets the copy's below.
    msgpack = getattr(serde, "_allowed_msgpack_modules", True)
    json_modules = getattr(serde, "_allowed_json_modules", True)
    allowed = {*_OWN_TYPES, *(msgpack if isinstance(msgpack, (set, frozenset)) else ())}
    if msgpack is not True and json_modules is not True and msgpack == allowed:
        return serde  # strict already (ours, or made so before)
    clone = copy.copy(serde)
    JsonPlusSerializer.__init__(
        clone,
        allowed_json_modules=json_modules if isinstance(json_modules, (set, frozenset)) else None,
        allowed_msgpack_modules=sorted(allowed),
    )
    return clone
