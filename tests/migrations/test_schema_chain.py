"""The state-schema chain on its own: each upcaster, and the chains that are refused."""

from __future__ import annotations

from typing import Any

import pytest

from langgraph_ckpt_ext.migrations import SchemaChain, SchemaVersionError


def v1_to_v2(values: dict[str, Any]) -> dict[str, Any]:
    """v2 renamed `objective` to `goal`."""
    values["goal"] = values.pop("objective", "")
    return values


def v2_to_v3(values: dict[str, Any]) -> dict[str, Any]:
    """v3 added `priority` (default 0) and keeps tool calls as dicts with a `name`."""
    values.setdefault("priority", 0)
    values["tools"] = [{"name": t} if isinstance(t, str) else t for t in values.get("tools", [])]
    return values


def test_each_upcaster_alone() -> None:
    assert v1_to_v2({"objective": "x", "n": 1}) == {"goal": "x", "n": 1}
    assert v2_to_v3({"goal": "x", "tools": ["search", {"name": "mail"}]}) == {
        "goal": "x", "priority": 0, "tools": [{"name": "search"}, {"name": "mail"}]
    }


def test_chain_upgrades_from_any_stored_version_without_touching_its_input() -> None:
    chain = SchemaChain(current=3, upcasters={1: v1_to_v2, 2: v2_to_v3})
    stored = {"objective": "x", "tools": ["search"]}
    assert chain.upgrade(stored, stored=1) == {"goal": "x", "priority": 0,
                                               "tools": [{"name": "search"}]}
    assert stored == {"objective": "x", "tools": ["search"]}
    assert chain.upgrade({"goal": "y"}, stored=2) == {"goal": "y", "priority": 0, "tools": []}
    assert chain.upgrade({"goal": "z"}, stored=3) == {"goal": "z"}
    assert chain.needs(1) and chain.needs(2) and not chain.needs(3)
    assert SchemaChain(current=1).upgrade({"a": 1}, stored=1) == {"a": 1}


def test_bad_chains_and_versions_are_refused_clearly() -> None:
    with pytest.raises(SchemaVersionError, match=r"gap.*\[2\]"):
        SchemaChain(current=4, upcasters={1: v1_to_v2, 3: v2_to_v3})
    with pytest.raises(SchemaVersionError, match="two upcasters from version 1"):
        SchemaChain(current=2, upcasters=[(1, v1_to_v2), (1, v2_to_v3)])
    with pytest.raises(SchemaVersionError, match="past the current version"):
        SchemaChain(current=2, upcasters={1: v1_to_v2, 2: v2_to_v3})
    with pytest.raises(SchemaVersionError, match="int >= 1"):
        SchemaChain(current=0)
    with pytest.raises(SchemaVersionError, match="not callable"):
        SchemaChain(current=2, upcasters={1: "nope"})  # type: ignore[dict-item]
    chain = SchemaChain(current=3, upcasters={1: v1_to_v2, 2: v2_to_v3})
    with pytest.raises(SchemaVersionError, match=r"newer than the 3.*never go down"):
        chain.upgrade({}, stored=4)
    with pytest.raises(SchemaVersionError, match="newer"):
        chain.needs(5)
    with pytest.raises(SchemaVersionError, match="older than the oldest"):
        SchemaChain(current=3, upcasters={2: v2_to_v3}).upgrade({}, stored=1)


def test_a_failing_or_wrong_upcaster_is_named() -> None:
    def broken(values: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("objective")

    with pytest.raises(SchemaVersionError, match="from version 1 to 2 failed"):
        SchemaChain(current=2, upcasters={1: broken}).upgrade({}, stored=1)
    with pytest.raises(SchemaVersionError, match="returned list"):
        SchemaChain(current=2, upcasters={1: lambda v: []}).upgrade({}, stored=1)  # type: ignore[arg-type,return-value]


def test_the_scenario_upcasters_alone() -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    from tests.support.schema_graphs import v1_to_v2 as rename
    from tests.support.schema_graphs import v2_to_v3 as to_messages

    assert rename({"objective": "x", "turns": 2}) == {"goal": "x", "turns": 2}
    assert rename({"turns": 2}) == {"turns": 2}  # nothing to rename: nothing invented
    out = to_messages({"messages": [{"id": "1", "role": "human", "text": "hi"},
                                    {"id": "2", "role": "ai", "text": "yo"}]})
    assert out == {"messages": [HumanMessage("hi", id="1"), AIMessage("yo", id="2")],
                   "priority": "normal"}
    assert to_messages({"priority": "high"}) == {"priority": "high"}


def test_langgraph_channels_pass_through_untouched() -> None:
    chain = SchemaChain(current=2, upcasters={1: lambda v: {k.upper(): x for k, x in v.items()}})
    out = chain.upgrade({"a": 1, "branch:to:node": None, "__pregel_tasks": [1]}, stored=1)
    assert out == {"A": 1, "branch:to:node": None, "__pregel_tasks": [1]}
    # the input a step started with is an update of state channels: upgraded like a write
    out = chain.upgrade({"__start__": {"a": 1, "__root__": 2}}, stored=1)
    assert out == {"__start__": {"A": 1, "__root__": 2}}
    assert chain.upgrade_write("__interrupt__", "x", 1) == [("__interrupt__", "x")]


def test_pending_writes_upgrade_without_the_defaults_of_an_empty_state() -> None:
    chain = SchemaChain(current=3, upcasters={1: v1_to_v2, 2: v2_to_v3})
    # a renamed channel's write is renamed; the defaults v2_to_v3 fills in are not written
    assert chain.upgrade_write("objective", "x", 1) == [("goal", "x")]
    assert chain.upgrade_write("tools", ["search"], 2) == [("tools", [{"name": "search"}])]
    # a write of the very value a default would give is still kept on its own channel
    assert chain.upgrade_write("priority", 0, 2) == [("priority", 0)]
    assert chain.upgrade_write("other", 5, 3) == [("other", 5)]  # already current


def test_a_step_with_an_explicit_write_rule() -> None:
    from langgraph_ckpt_ext.migrations import SchemaStep as Step

    def split(values: dict[str, Any]) -> dict[str, Any]:
        first, _, last = values.pop("name", "").partition(" ")
        values.update(first=first, last=last)
        return values

    def split_write(channel: str, value: Any) -> list[tuple[str, Any]]:
        if channel != "name":
            return [(channel, value)]
        first, _, last = value.partition(" ")
        return [("first", first), ("last", last)]

    chain = SchemaChain(current=2, upcasters={1: Step(split, split_write)})
    assert chain.upgrade({"name": "Ada Lovelace"}, 1) == {"first": "Ada", "last": "Lovelace"}
    assert chain.upgrade_write("name", "Ada Lovelace", 1) == [("first", "Ada"),
                                                              ("last", "Lovelace")]
    assert chain.upgrade_write("age", 36, 1) == [("age", 36)]
    with pytest.raises(SchemaVersionError, match="not callable"):
        SchemaChain(current=2, upcasters={1: Step(split, "nope")})  # type: ignore[arg-type]


def test_a_schema_version_field_follows_the_chain() -> None:
    chain = SchemaChain(current=3, upcasters={1: v1_to_v2, 2: v2_to_v3})
    assert chain.upgrade({"schema_version": 1, "objective": "x"}, 1)["schema_version"] == 3
    assert "schema_version" not in chain.upgrade({"objective": "x"}, 1)


def test_a_failing_upcaster_names_its_step() -> None:
    def broken(values: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("objective")

    chain = SchemaChain(current=2, upcasters={1: broken})
    with pytest.raises(SchemaVersionError, match="from version 1 to 2 failed"):
        chain.upgrade({"a": 1}, 1)
    with pytest.raises(SchemaVersionError, match="returned list"):
        SchemaChain(current=2, upcasters={1: lambda v: [v]}).upgrade({}, 1)


def test_a_chain_name_is_stamped_and_decides_what_it_owns() -> None:
    from langgraph_ckpt_ext.migrations import stored_schema_name

    named = SchemaChain(current=3, upcasters={1: v1_to_v2, 2: v2_to_v3}, name="support")
    assert named.stamp() == {"schema_version": 3, "schema_name": "support"}
    assert named.owns("support") and named.owns(None) and not named.owns("billing")
    assert repr(named) == "SchemaChain(current=3, first=1, name='support')"
    unnamed = SchemaChain(current=2, upcasters={1: v1_to_v2})
    assert unnamed.stamp() == {"schema_version": 2} and unnamed.name is None
    assert unnamed.owns(None) and not unnamed.owns("support")
    for bad in ("", "  ", 7):
        with pytest.raises(SchemaVersionError, match="name must be a non-empty string"):
            SchemaChain(current=1, name=bad)  # type: ignore[arg-type]
    assert stored_schema_name({"schema_name": "support"}, "c1") == "support"
    assert stored_schema_name({}, "c1") is None
    with pytest.raises(SchemaVersionError, match=r"'c1' has schema_name 3.*not a string"):
        stored_schema_name({"schema_name": 3}, "c1")


def test_former_step_name_still_imports_with_a_warning() -> None:
    """`Step` was the top-level name of `SchemaStep`: still importable, with a warning that
    names the new one."""
    import langgraph_ckpt_ext
    import langgraph_ckpt_ext.migrations as migrations
    from langgraph_ckpt_ext import SchemaStep

    for module in (langgraph_ckpt_ext, migrations):
        with pytest.warns(DeprecationWarning, match="import SchemaStep instead"):
            assert module.Step is SchemaStep
        assert "Step" not in module.__all__
