"""The serializers a checkpointer stores and loads with: LangGraph's, made strict (a stored row
may construct only allowlisted classes)."""

from __future__ import annotations

import copy
import dataclasses
import enum
import sys

from langgraph.checkpoint.serde import jsonplus
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


class LoadedDataTypes(frozenset[tuple[str, ...]]):
    """An allowlist of (module, class name) that also holds every data type the application
    already loaded: a class found in a module that is imported (never importing one), that is
    an `Enum`, a dataclass, a `NamedTuple`, a pydantic (v1 or v2) model or one of LangChain's
    serializable objects. So a state's own types come back as themselves, as with LangGraph's
    savers, while a stored blob still cannot import a module, call a function or build any
    other class. LangGraph's `with_msgpack_allowlist` (strict mode) makes a plain set of its
    entries: exactly the types it lists, nothing loaded."""

    def __contains__(self, key: object) -> bool:
        return frozenset.__contains__(self, key) or loaded_data_type(key)


def loaded_data_type(key: object) -> bool:
    """Whether `key`, (module, class name), names a data type of a module already imported."""
    if not (isinstance(key, tuple) and len(key) == 2
            and all(isinstance(part, str) for part in key)):
        return False
    module = sys.modules.get(key[0])
    if module is None:
        return False
    # the module's own namespace: a module-level __getattr__ could import
    found = vars(module).get(key[1])
    return isinstance(found, type) and _is_data_type(found)


def _is_data_type(cls: type) -> bool:
    """A class whose construction from stored fields runs no hook of its own meant for side
    effects: not a dataclass with a `__post_init__` or an `__init__` of its own, an Enum with
    its own `_missing_`, or a pydantic model with its own `model_post_init`. (A model's
    validators and `__init__` run: LangChain's own types have one.)"""
    if issubclass(cls, enum.Enum):
        return "_missing_" not in _own_attributes(cls, enum.Enum)
    if dataclasses.is_dataclass(cls):
        init = getattr(cls, "__init__", None)
        generated = getattr(getattr(init, "__code__", None), "co_filename", "") == "<string>"
        return not hasattr(cls, "__post_init__") and generated
    if issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple):
        # a NamedTuple, made by `collections.namedtuple` (its `__new__` is generated too)
        return str(getattr(cls.__new__, "__module__", "")).startswith("namedtuple_")
    bases = [b for b in cls.__mro__ if (b.__module__, b.__qualname__) in _DATA_BASES]
    return bool(bases) and "model_post_init" not in _own_attributes(cls, *bases)


def _own_attributes(cls: type, *bases: type) -> set[str]:
    """Names defined by `cls` and its classes before the first of `bases` in its MRO."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass in bases or klass is object:
            break
        names.update(vars(klass))
    return names


# pydantic's models (v2, and v1 in either package) and LangChain's serializable objects
_DATA_BASES = {("pydantic.main", "BaseModel"), ("pydantic.v1.main", "BaseModel"),
               ("langchain_core.load.serializable", "Serializable")}


def strict_serde() -> SerializerProtocol:
    """LangGraph's serializer, strict: a stored blob may construct only LangGraph's safe types,
    the typed parts of our `AgentState`, the data types the application loaded
    (`LoadedDataTypes`), or, when LangGraph gives an allowlist (`with_allowlist`), exactly the
    types it names."""
    return _with_loaded_types(JsonPlusSerializer(allowed_msgpack_modules=_OWN_TYPES))


def _with_loaded_types(serde: JsonPlusSerializer) -> JsonPlusSerializer:
    """`serde` (made with an explicit allowlist) also loading the data types loaded. LangGraph
    keeps the allowlist in a private attribute that its ext hook closes over: both are set
    again here, as its own `with_msgpack_allowlist` does."""
    allowed = getattr(serde, "_allowed_msgpack_modules", None)
    hook = getattr(jsonplus, "_create_msgpack_ext_hook", None)
    if not isinstance(allowed, (set, frozenset)) or hook is None:
        return serde  # another LangGraph than the one this was written for: strict as it is
    serde._allowed_msgpack_modules = LoadedDataTypes(allowed)  # type: ignore[assignment]
    serde._unpack_ext_hook = hook(serde._allowed_msgpack_modules)
    return serde


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
    # LangGraph's default (every class): the data types loaded; a list of the caller's (or
    # None, LangGraph's strict mode) stays exactly that
    return _with_loaded_types(clone) if msgpack is True else clone
