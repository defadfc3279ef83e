"""`diff_values`: each kind of change, `apply` reproducing the newer state, and rendering."""

from __future__ import annotations

import copy
import json
import random
from datetime import datetime, timezone
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from langgraph_ckpt_ext.state import PlanStep, ToolCall, WorkingMemory
from langgraph_ckpt_ext.timetravel.statediff import Change, StateDiff, diff_values

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def check(a: dict[str, Any], b: dict[str, Any]) -> StateDiff:
    """The diff of (a, b), after checking it rebuilds b without touching a."""
    before = copy.deepcopy(a)
    d = diff_values(a, b)
    assert d.apply(a) == b
    assert a == before
    assert not diff_values(a, a) and not diff_values(b, b)
    json.dumps(d.to_dict())
    return d


def kinds(d: StateDiff) -> list[tuple[tuple[Any, ...], str]]:
    return [(c.path, c.kind) for c in d]


def test_equal_states_have_no_changes() -> None:
    state = {"goal": "x", "wm": WorkingMemory(facts={"a": [1, {"b": 2}]}), "n": 1.5}
    d = diff_values(state, copy.deepcopy(state))
    assert not d and len(d) == 0 and d.changes == []
    assert "no changes" in d.to_text()
    assert d.apply(state) == state


def test_channels_added_removed_changed() -> None:
    d = check({"goal": "a", "old": 1, "same": [1]}, {"goal": "b", "new": 2, "same": [1]})
    assert kinds(d) == [(("goal",), "changed"), (("old",), "removed"), (("new",), "added")]
    assert d.channels_added == ["new"]
    assert d.channels_removed == ["old"]
    assert d.channels_changed == ["goal"]
    assert d.changes[1].old == 1 and d.changes[2].new == 2


def test_nested_dicts_by_path() -> None:
    a = {"cfg": {"x": {"y": 1, "z": "keep", "gone": None}, "w": 0}}
    b = {"cfg": {"x": {"y": 2, "z": "keep", "extra": [1]}, "w": 0}}
    d = check(a, b)
    assert kinds(d) == [
        (("cfg", "x", "y"), "changed"),
        (("cfg", "x", "gone"), "removed"),
        (("cfg", "x", "extra"), "added"),
    ]
    assert d.channels_changed == ["cfg"] and not d.channels_added


@pytest.mark.parametrize(
    ("old", "new", "delta"),
    [(2, 3, 1), (10, 4, -6), (0.25, 0.75, 0.5), (1, 2.5, 1.5)],
)
def test_numbers_have_a_delta(old: float, new: float, delta: float) -> None:
    d = check({"n": old}, {"n": new})
    assert kinds(d) == [(("n",), "changed")]
    assert d.changes[0].delta == pytest.approx(delta)
    assert type(d.changes[0].delta) is type(new - old)


def test_bool_is_not_a_number() -> None:
    d = check({"flag": False, "n": 1}, {"flag": True, "n": True})
    assert [c.delta for c in d] == [None, None]
    # `1 == True`, but the value's type changed
    assert kinds(d) == [(("flag",), "changed"), (("n",), "changed")]


def test_pydantic_model_by_field() -> None:
    a = {"working_memory": WorkingMemory(scratchpad="s", facts={"turn": 2, "city": "Oslo"})}
    b = {"working_memory": WorkingMemory(scratchpad="s", facts={"turn": 3, "city": "Oslo"},
                                         updated_at=T0)}
    d = check(a, b)
    assert kinds(d) == [
        (("working_memory", "facts", "turn"), "changed"),
        (("working_memory", "updated_at"), "changed"),
    ]
    assert d.changes[0].delta == 1
    rebuilt = d.apply(a)["working_memory"]
    assert type(rebuilt) is WorkingMemory and rebuilt == b["working_memory"]
    assert "~ working_memory.facts.turn: 2 -> 3 (+1)" in d.to_text()


def test_pydantic_models_in_lists() -> None:
    plan = [PlanStep(id="1", description="look"), PlanStep(id="2", description="answer")]
    done = [plan[0].model_copy(update={"status": "done", "result": "ok"}), plan[1]]
    call = ToolCall(id="c1", name="search", args={"q": "x"}, started_at=T0)
    a = {"plan": plan, "tool_call_history": [call]}
    b = {"plan": done, "tool_call_history": [call, ToolCall(id="c2", name="search", result={"n": 1})]}
    d = check(a, b)
    assert kinds(d) == [(("plan",), "changed"), (("tool_call_history",), "appended")]
    assert d.changes[1].new == [b["tool_call_history"][1]]
    # a model of another class is replaced whole
    d = check({"x": PlanStep(id="1", description="d")}, {"x": call})
    assert kinds(d) == [(("x",), "changed")]


def test_appended_list() -> None:
    d = check({"notes": ["a", "b"], "empty": []}, {"notes": ["a", "b", "c", "d"], "empty": [1]})
    assert kinds(d) == [(("notes",), "appended"), (("empty",), "appended")]
    assert d.changes[0].new == ["c", "d"] and d.changes[0].old is None
    assert "+ notes:" in d.to_text() and '+= ["c", "d"]' in d.to_text()


@pytest.mark.parametrize(
    ("old", "new"),
    [(["a", "b"], ["a"]), (["a", "b"], ["b", "a"]), ([1, 2], [1, 3, 4]), ([1], (1, 2)), ([1], [1.0])],
)
def test_other_list_changes_are_whole(old: Any, new: Any) -> None:
    d = check({"xs": old}, {"xs": new})
    assert kinds(d) == [(("xs",), "changed")]


def conversation() -> list[BaseMessage]:
    return [
        HumanMessage("question 1", id="h-1"),
        AIMessage("", id="ai-1", tool_calls=[{"id": "call-1", "name": "search", "args": {}}]),
        ToolMessage("found", tool_call_id="call-1", id="t-1"),
        AIMessage("answer 1", id="ai-2"),
    ]


def test_messages_added() -> None:
    a = {"messages": conversation()}
    b = {"messages": [*conversation(), HumanMessage("q2", id="h-2"), AIMessage("answer 3", id="ai-3")]}
    d = check(a, b)
    assert kinds(d) == [(("messages", "h-2"), "message_added"), (("messages", "ai-3"), "message_added")]
    assert d.changes[1].new == b["messages"][-1]
    assert "+ messages[id=ai-3]:" in d.to_text() and 'AIMessage "answer 3"' in d.to_text()


def test_messages_removed_edited_and_inserted() -> None:
    a = {"messages": conversation()}
    msgs = conversation()
    b = {"messages": [HumanMessage("first", id="h-0"), msgs[0], msgs[1],
                      AIMessage("answer 1, revised", id="ai-2")]}
    d = check(a, b)
    assert kinds(d) == [
        (("messages", "t-1"), "message_removed"),
        (("messages", "h-0"), "message_added"),
        (("messages", "ai-2"), "message_edited"),
    ]
    edited = d.changes[2]
    assert edited.old.content == "answer 1" and edited.new.content == "answer 1, revised"
    assert d.message_order[("messages",)] == ("h-0", "h-1", "ai-1", "ai-2")
    text = d.to_text()
    assert "- messages[id=t-1]:" in text and "~ messages[id=ai-2]:" in text


def test_messages_edited_type_and_fields() -> None:
    a = {"messages": [HumanMessage("x", id="m")]}
    b = {"messages": [AIMessage("x", id="m")]}
    assert kinds(check(a, b)) == [(("messages", "m"), "message_edited")]
    b = {"messages": [HumanMessage("x", id="m", name="bob")]}
    assert kinds(check(a, b)) == [(("messages", "m"), "message_edited")]


def test_messages_reordered() -> None:
    msgs = conversation()
    b = {"messages": [msgs[3], msgs[0], msgs[2], msgs[1]]}
    d = check({"messages": msgs}, b)
    # a pure reorder has no message to name: the list changed whole
    assert kinds(d) == [(("messages",), "changed")]
    b = {"messages": [msgs[3], msgs[0], AIMessage("new", id="ai-9"), msgs[1]]}
    d = check({"messages": msgs}, b)
    assert {c.kind for c in d} == {"message_added", "message_removed"}
    assert d.apply({"messages": msgs})["messages"] == b["messages"]


def test_message_lists_without_ids_are_lists() -> None:
    a = {"messages": [HumanMessage("x")]}
    d = check(a, {"messages": [HumanMessage("x"), AIMessage("y")]})
    assert kinds(d) == [(("messages",), "appended")]
    dup = [HumanMessage("x", id="same"), AIMessage("y", id="same")]
    d = check({"messages": dup}, {"messages": dup[:1]})
    assert kinds(d) == [(("messages",), "changed")]


def test_messages_nested_in_a_dict() -> None:
    a = {"sub": {"history": conversation(), "n": 1}}
    b = {"sub": {"history": conversation()[:2], "n": 1}}
    d = check(a, b)
    assert kinds(d) == [(("sub", "history", "t-1"), "message_removed"),
                        (("sub", "history", "ai-2"), "message_removed")]
    assert "sub.history[id=t-1]" in d.to_text()


def test_apply_does_not_need_the_same_objects() -> None:
    a = {"wm": WorkingMemory(facts={"k": [1, 2]}), "messages": conversation()}
    b = {"wm": WorkingMemory(facts={"k": [1, 2, 3]}), "messages": conversation()[1:]}
    d = diff_values(a, b)
    assert d.apply(copy.deepcopy(a)) == b


def test_labels_in_text_and_html() -> None:
    d = diff_values({"x": 1}, {"x": 2}, labels=("ckpt-1", "ckpt-2"))
    assert d.labels == ("ckpt-1", "ckpt-2")
    assert d.to_text().splitlines()[:2] == ["--- ckpt-1", "+++ ckpt-2"]
    assert "ckpt-1" in d._repr_html_() and d.to_dict()["labels"] == ["ckpt-1", "ckpt-2"]
    assert str(d) == d.to_text()


def test_text_is_aligned_and_short() -> None:
    a = {"a": 1, "long_channel_name": {"inner": "x" * 500}}
    b = {"a": 2, "long_channel_name": {"inner": "y" * 500}}
    lines = diff_values(a, b).to_text().splitlines()
    assert lines[0].index("1 -> 2") == lines[1].index('"x')
    assert all(len(line) < 200 for line in lines)


def test_rendering_escapes_and_names_paths() -> None:
    evil = "<script>alert(1)</script>"
    a = {"goal": "safe", "messages": [HumanMessage("hi", id="h-1")], "wm": WorkingMemory()}
    b = {"goal": evil, "messages": [HumanMessage("hi", id="h-1"), AIMessage(evil, id="ai-<3>")],
         "wm": WorkingMemory(facts={"turn": 1})}
    d = check(a, b)
    text = d.to_text()
    for path in ("goal", "messages[id=ai-<3>]", "wm.facts.turn"):
        assert path in text
    page = d._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page
    for path in ("goal", "messages[id=ai-&lt;3&gt;]", "wm.facts.turn"):
        assert path in page
    assert page.count("<tr style=") == len(d)


def test_to_dict_is_json() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "Opaque()"

    a = {"t": T0, "o": 1, "messages": conversation(), "m": {(1, 2): "tuple key"}}
    b = {"t": datetime(2026, 2, 1, tzinfo=timezone.utc), "o": Opaque(),
         "messages": [*conversation(), AIMessage("z", id="ai-9")],
         "m": {(1, 2): "other"}, "plan": [PlanStep(id="1", description="d")],
         "calls": [ToolCall(id="c", name="n", started_at=T0)]}
    d = diff_values(a, b, labels=("a", "b"))
    data = json.loads(json.dumps(d.to_dict()))
    changes = {tuple(map(str, c["path"])): c for c in data["changes"]}
    assert changes[("t",)] == {"path": ["t"], "kind": "changed", "old": T0.isoformat(),
                               "new": "2026-02-01T00:00:00+00:00"}
    assert changes[("o",)]["new"] == "Opaque()"
    assert changes[("messages", "ai-9")]["new"]["content"] == "z"
    assert changes[("m", "(1, 2)")]["old"] == "tuple key"
    assert changes[("plan",)]["new"] == [{"id": "1", "description": "d", "status": "pending",
                                          "result": None}]
    assert changes[("calls",)]["new"][0]["started_at"].startswith("2026-01-01T00:00:00")
    assert data["message_order"] == [
        {"path": ["messages"], "ids": ["h-1", "ai-1", "t-1", "ai-2", "ai-9"]}
    ]


def test_change_is_a_value() -> None:
    c = Change(("n",), "changed", old=1, new=2, delta=1)
    assert c == Change(("n",), "changed", 1, 2, 1)
    assert str(c) == "~ n: 1 -> 2 (+1)"
    assert str(Change(("d", "k k", 3), "added", new="v")) == '+ d["k k"][3]: "v"'


# -- randomized ----------------------------------------------------------------------------------


class Gen:
    """Random nested states and random edits of them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ids = 0

    def msg(self) -> BaseMessage:
        self.ids += 1
        kind = self.rng.choice([HumanMessage, AIMessage])
        return kind(self.text(), id=f"m-{self.ids}")

    def text(self) -> str:
        return self.rng.choice(["", "a", "b", "<b>", "long " * 20, "é"])

    def scalar(self) -> Any:
        return self.rng.choice([
            self.rng.randint(-5, 5), self.rng.uniform(-1, 1), self.rng.random() < 0.5, None,
            self.text(),
        ])

    def value(self, depth: int = 0) -> Any:
        roll = self.rng.random()
        if depth >= 3 or roll < 0.4:
            return self.scalar()
        if roll < 0.6:
            return {f"k{i}": self.value(depth + 1) for i in range(self.rng.randint(0, 4))}
        if roll < 0.75:
            return [self.value(depth + 1) for _ in range(self.rng.randint(0, 4))]
        if roll < 0.9:
            return [self.msg() for _ in range(self.rng.randint(0, 4))]
        facts = {f"f{i}": self.value(depth + 1) for i in range(self.rng.randint(0, 3))}
        return WorkingMemory(scratchpad=self.text(), facts=facts)

    def state(self) -> dict[str, Any]:
        return {f"ch{i}": self.value() for i in range(self.rng.randint(0, 6))}

    def edit(self, v: Any, depth: int = 0) -> Any:
        """A copy of `v`, changed somewhere (or not at all)."""
        r = self.rng.random()
        if r < 0.15:
            return v
        if r < 0.25 or depth > 4:
            return self.value(depth)
        if isinstance(v, dict):
            return self.edit_dict(v, depth)
        if isinstance(v, WorkingMemory):
            facts = self.edit(v.facts, depth + 1)
            return v.model_copy(update={"facts": facts if isinstance(facts, dict) else {}})
        if isinstance(v, list) and v and all(isinstance(m, BaseMessage) for m in v):
            return self.edit_messages(v)
        if isinstance(v, list):
            if self.rng.random() < 0.5:
                return [*v, *(self.value(depth + 1) for _ in range(self.rng.randint(1, 3)))]
            return [self.edit(x, depth + 1) for x in v]
        return self.scalar()

    def edit_dict(self, v: dict[str, Any], depth: int = 0) -> dict[str, Any]:
        out = dict(v)
        for k in list(out):
            roll = self.rng.random()
            if roll < 0.2:
                del out[k]
            elif roll < 0.7:
                out[k] = self.edit(out[k], depth + 1)
        if self.rng.random() < 0.3:
            out[f"n{self.rng.randint(0, 9)}"] = self.value(depth + 1)
        return out

    def edit_messages(self, msgs: list[BaseMessage]) -> list[BaseMessage]:
        out = [m for m in msgs if self.rng.random() > 0.2]
        out = [m.model_copy(update={"content": self.text()}) if self.rng.random() < 0.3 else m
               for m in out]
        for _ in range(self.rng.randint(0, 3)):
            out.insert(self.rng.randint(0, len(out)), self.msg())
        if self.rng.random() < 0.3:
            self.rng.shuffle(out)
        return out


def test_random_states_apply_exactly() -> None:
    seen: set[str] = set()
    for seed in range(500):
        gen = Gen(seed)
        a = gen.state()
        b = gen.edit_dict(a)
        d = check(a, b)
        assert bool(d) or a == b, seed
        d.to_text()
        d._repr_html_()
        for c in d:  # two values that differ never read alike
            old, new = c.sides()
            assert not (old and new) or old != new, (seed, c)
        seen.update(c.kind for c in d)
    assert seen == {"added", "removed", "changed", "appended",
                    "message_added", "message_removed", "message_edited"}


# -- rendering that shows where values differ ---------------------------------------------------


def html_cells(d: StateDiff) -> list[list[str]]:
    """The cells of each row of the HTML table: symbol, path, kind, old, new, delta."""
    import re

    return [re.findall(r"<td>(.*?)</td>", row)
            for row in re.findall(r"<tr style=[^>]*>(.*?)</tr>", d._repr_html_())]


class Same:
    """Values of one repr that are not equal."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.n == self.n

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "Same()"


def long_call(i: int, note: str = "") -> ToolCall:
    return ToolCall(id=f"call-{i}", name="search", args={"query": "weather in Oslo " * 4 + note},
                    started_at=T0)


def test_list_changes_name_the_items_that_differ() -> None:
    one = {"tool_call_history": [long_call(1)]}
    edited = {"tool_call_history": [long_call(1, "again")]}
    two = {"tool_call_history": [long_call(1, "again"), long_call(2)]}
    d1, d2 = check(one, edited), check(one, two)
    assert kinds(d1) == kinds(d2) == [(("tool_call_history",), "changed")]
    assert d1.to_text() != d2.to_text()
    assert html_cells(d1)[0][4] != html_cells(d2)[0][4]
    line = d2.to_text()
    assert "1 item -> 2 items" in line and "+[1] ToolCall(" in line and "~[0]" in line
    assert 'id="call-2"' in line and "again" in line  # the point of difference is shown
    # removed items, and an insertion in the middle, by index
    d = check({"xs": ["a", "b", "c", "d"]}, {"xs": ["a", "d"]})
    assert "4 items -> 2 items" in d.to_text() and '-[1] "b"' in d.to_text()
    assert '-[2] "c"' in d.to_text()
    d = check({"xs": [1, 2, 3]}, {"xs": [1, 9, 2, 3]})
    assert "+[1] 9" in d.to_text() and "[0]" not in d.to_text()


def test_dict_changes_name_the_keys_that_differ() -> None:
    from collections import OrderedDict

    a = {"cfg": {"model": "m" * 80, "temperature": 0.1, "gone": 1}}
    b = {"cfg": OrderedDict(model="m" * 80, temperature=0.2, new=2)}  # another type: whole
    line = check(a, b).to_text()
    assert '~"temperature": 0.1 -> 0.2' in line
    assert '-"gone": 1' in line and '+"new": 2' in line


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("x" * 300 + "a", "x" * 300 + "b"),                     # differ past the width
        ("x" * 300, "x" * 301),                                  # one a prefix of the other
        ("x" * 20_000 + "a", "x" * 20_000 + "b"),               # past any budget
        (Same(1), Same(2)),                                      # one repr, not equal
        (["item " * 30], ["item " * 30 + "!", "more"]),          # one item against two
        ([1] * 80 + [2], [1] * 81 + [2]),
        ({"k": "v" * 100, "n": 1}, {"k": "v" * 100, "n": 1.0}),  # by key: 1 -> 1.0
        ([1], (1,)),                                             # the same text, other type
        (b"\x00" * 100 + b"\x01", b"\x00" * 100 + b"\x02"),
        (datetime(2026, 1, 1, tzinfo=timezone.utc), "2026-01-01T00:00:00+00:00"),
        (WorkingMemory(scratchpad="s" * 200, facts={"a": 1}),
         PlanStep(id="s" * 200, description="d")),
    ],
)
def test_different_values_never_render_alike(old: Any, new: Any) -> None:
    d = check({"v": old}, {"v": new})
    (change,) = d.changes
    cells = html_cells(d)[0]
    assert cells[3] != cells[4], cells
    assert " -> " in change.detail()
    old_text, new_text = change.detail().split(" -> ", 1)
    assert old_text != new_text.split(" (")[0]
    assert all(len(line) < 200 for line in d.to_text().splitlines())


def test_values_render_json_like() -> None:
    a = {"t": T0, "call": ToolCall(id="c1", name="search", args={"q": "x"}),
         "raw": b"abc", "blob": b"\xff\x00", "n": None, "ok": True}
    b = {"t": datetime(2026, 2, 1, tzinfo=timezone.utc), "call": PlanStep(id="1", description="d"),
         "raw": b"abd", "blob": b"\xff\x01", "n": 1, "ok": False}
    text = check(a, b).to_text()
    assert '"2026-01-01T00:00:00+00:00" -> "2026-02-01T00:00:00+00:00"' in text
    assert 'ToolCall(id="c1", name="search", args={"q": "x"})' in text
    assert 'b"abc" -> b"abd"' in text and "null -> 1" in text and "true -> false" in text
    assert "ff00" in text and "ff01" in text
    for python in ("datetime.datetime(", "'", "None", "True"):
        assert python not in text
    page = check(a, b)._repr_html_()
    assert "datetime.datetime(" not in page and "2026-02-01T00:00:00+00:00" in page
