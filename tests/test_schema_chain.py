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
