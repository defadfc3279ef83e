"""Time travel at a human's answer, on every backend and through SmartCheckpointer: a fork at a
checkpoint where the graph waited for a human waits there again, for a new answer, even after
the source thread was answered and ran on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from langgraph_ckpt_ext import OnEvents, Periodic, SmartCheckpointer
from langgraph_ckpt_ext.core.errors import InvalidConfigError
from langgraph_ckpt_ext.timetravel import (
    Variant,
    aab_test,
    ab_test,
    afork,
    fork,
    history,
)
from tests.support.answer_graphs import (
    Calls,
    decision_graph,
    nested_graph,
    parallel_graph,
    two_questions_graph,
)
from tests.support.common import conf
from tests.support.graphs import subgraph_graph
from tests.support.savers import BACKENDS, open_saver, params

SMART = {"smart-events:sqlite": OnEvents(), "smart-periodic:sqlite": Periodic(3600)}


@pytest.fixture(params=[*params(BACKENDS), *params(SMART)])
def answer_saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Every backend, and a SmartCheckpointer over SQLite under two policies."""
    kind = str(request.param)
    with open_saver(kind.rpartition(":")[2], tmp_path, wrapper="smart" if kind in SMART else None,
                    policy=SMART.get(kind)) as h:
        yield h.saver


def rows(saver: Any, thread: str) -> list[Any]:
    """Everything a thread holds, through the saver interface (any saver, wrappers too)."""
    return [(t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes)
            for t in saver.list({"configurable": {"thread_id": thread}})]


def answered(graph: Any, thread: str, answer: str, inputs: Any = None) -> Any:
    """Run a thread to its interrupt, answer it; the paused state (before the answer)."""
    graph.invoke(inputs or {"request": "refund", "log": []}, conf(thread))
    paused = graph.get_state(conf(thread))
    assert paused.interrupts
    graph.invoke(Command(resume=answer), conf(thread))
    return paused


def test_fork_at_an_answered_interrupt_waits_for_a_new_answer(answer_saver: Any) -> None:
    calls: Calls = []
    graph = decision_graph(calls).compile(checkpointer=answer_saver)
    paused = answered(graph, "src", "yes")
    assert graph.get_state(conf("src")).values["log"][-2:] == ["approved", "notified yes"]
    before = rows(answer_saver, "src")

    head = fork(answer_saver, paused.config, "f")
    waiting = graph.get_state(head)
    assert waiting.next == ("ask",) and "answer" not in waiting.values
    assert [i.value for t in waiting.tasks for i in t.interrupts] == [
        {"question": "approve refund?"}]
    assert waiting.tasks[0].result is None  # the answered task's output is gone
    live = graph.get_state(conf("f"))
    assert live.next == ("ask",) and [i.value for i in live.interrupts] == [
        {"question": "approve refund?"}]
    out = graph.invoke(Command(resume="no"), head)
    assert out["answer"] == "no" and out["log"] == ["human said no", "denied", "notified no"]
    assert calls == [("src", "yes"), ("f", "no")]  # once per branch, with its own answer

    # the stored answer is gone: going on without one asks again, nothing runs
    again = fork(answer_saver, paused.config, "f-none")
    assert "__interrupt__" in graph.invoke(None, again)
    assert graph.get_state(conf("f-none")).next == ("ask",) and len(calls) == 2

    # answered in one call
    one = fork(answer_saver, paused.config, "f-one", resume="no", graph=graph)
    assert one["configurable"]["thread_id"] == "f-one"
    assert graph.get_state(one).values["log"] == ["human said no", "denied", "notified no"]
    assert graph.get_state(conf("f-one")).next == ()
    assert calls[-1] == ("f-one", "no") and len(calls) == 3

    # the source is untouched, and still says yes
    assert rows(answer_saver, "src") == before
    assert graph.get_state(conf("src")).values["answer"] == "yes"
    marked = [e for e in history(answer_saver, "f") if e.metadata.get("fork_thread") == "f"]
    assert [e.checkpoint_id for e in marked] == [paused.config["configurable"]["checkpoint_id"]]


def test_fork_resume_bad_input_changes_nothing(answer_saver: Any) -> None:
    calls: Calls = []
    graph = decision_graph(calls).compile(checkpointer=answer_saver)
    paused = answered(graph, "src", "yes")
    with pytest.raises(InvalidConfigError, match="graph="):
        fork(answer_saver, paused.config, "x", resume="no")
    with pytest.raises(InvalidConfigError, match="waits for no answer"):
        fork(answer_saver, conf("src"), "x", resume="no", graph=graph)  # the finished head
    with pytest.raises(InvalidConfigError, match="input or resume"):
        Variant(input={"request": "r"}, resume="no")
    assert rows(answer_saver, "x") == [] and len(calls) == 1


def test_ab_test_arms_each_give_their_own_answer(answer_saver: Any) -> None:
    calls: Calls = []
    graph = decision_graph(calls).compile(checkpointer=answer_saver)
    paused = answered(graph, "src", "yes")
    before = rows(answer_saver, "src")
    result = ab_test(graph, paused.config, {
        "approve": Variant(resume="yes", thread_id="arm-yes"),
        "deny": Variant(input=Command(resume="no"), thread_id="arm-no"),
    })
    values = {n: r.values for n, r in result.runs.items()}
    assert values["approve"] == {"request": "refund", "answer": "yes",
                                 "log": ["human said yes", "approved", "notified yes"]}
    assert values["deny"] == {"request": "refund", "answer": "no",
                              "log": ["human said no", "denied", "notified no"]}
    assert sorted(calls) == [("arm-no", "no"), ("arm-yes", "yes"), ("src", "yes")]
    assert result.diff("approve", "deny").channels_changed == ["answer", "log"]
    assert rows(answer_saver, "src") == before


async def test_async_fork_and_ab_test_at_an_answered_interrupt(answer_saver: Any) -> None:
    calls: Calls = []
    graph = decision_graph(calls).compile(checkpointer=answer_saver)
    await graph.ainvoke({"request": "refund", "log": []}, conf("src"))
    paused = await graph.aget_state(conf("src"))
    await graph.ainvoke(Command(resume="yes"), conf("src"))
    head = await afork(answer_saver, paused.config, "af", resume="no", graph=graph)
    assert (await graph.aget_state(head)).values["log"][-1] == "notified no"
    result = await aab_test(graph, paused.config, {
        "yes": Variant(resume="yes", thread_id="ab-yes"),
        "no": Variant(resume="no", thread_id="ab-no"),
    })
    assert {n: r.values["answer"] for n, r in result.runs.items()  # type: ignore[index]
            } == {"yes": "yes", "no": "no"}
    assert sorted(calls) == [("ab-no", "no"), ("ab-yes", "yes"), ("af", "no"), ("src", "yes")]


def test_fork_keeps_the_branch_that_did_not_read_the_answer(answer_saver: Any) -> None:
    calls: Calls = []
    graph = parallel_graph(calls).compile(checkpointer=answer_saver)
    paused = answered(graph, "src", "yes")
    assert calls == [("src", "fetch"), ("src", "yes")]
    head = fork(answer_saver, paused.config, "f")
    waiting = graph.get_state(conf("f"))  # the live view: what is still due
    assert waiting.next == ("ask",) and waiting.interrupts
    results = {t.name: t.result for t in graph.get_state(head).tasks}
    assert results == {"fetch": {"log": ["notified fetch"]}, "ask": None}
    out = graph.invoke(Command(resume="no"), head)
    assert sorted(out["log"]) == ["human said no", "notified fetch", "notified no"]
    # `fetch` finished before the pause: its result is kept, it does not run again
    assert calls == [("src", "fetch"), ("src", "yes"), ("f", "no")]


def test_fork_at_a_node_that_asked_twice_waits_at_its_last_question(answer_saver: Any) -> None:
    calls: Calls = []
    graph = two_questions_graph(calls).compile(checkpointer=answer_saver)
    graph.invoke({"request": "r", "log": []}, conf("src"))
    graph.invoke(Command(resume="a"), conf("src"))
    paused = graph.get_state(conf("src"))
    assert [i.value for i in paused.interrupts] == ["second?"]
    graph.invoke(Command(resume="b"), conf("src"))
    assert calls == [("src", "a/b")]
    head = fork(answer_saver, paused.config, "f")
    assert [i.value for i in graph.get_state(head).interrupts] == ["second?"]
    assert graph.invoke(Command(resume="c"), head)["answer"] == "a/c"
    assert calls == [("src", "a/b"), ("f", "a/c")]


def test_fork_at_an_answered_interrupt_inside_a_subgraph(answer_saver: Any) -> None:
    graph = subgraph_graph().compile(checkpointer=answer_saver)
    paused = answered(graph, "outer", "src", {"text": "x", "trail": []})
    assert graph.get_state(conf("outer")).values["text"] == "x+outer+inner(src)"
    head = fork(answer_saver, paused.config, "outer-fork")
    assert graph.get_state(head).next == ("child",)
    out = graph.invoke(Command(resume="ok"), head)
    assert out["text"] == "x+outer+inner(ok)" and out["trail"] == ["outer"]
    assert graph.get_state(conf("outer")).values["text"] == "x+outer+inner(src)"


def test_fork_inside_a_subgraph_resumes_the_subgraph_where_it_paused(answer_saver: Any) -> None:
    """The subgraph's own checkpoints up to its pause come along (they are written after the
    parent's fork point): its nodes before the question do not run again in the fork, and
    the subgraph's answer is dropped there too."""
    calls: Calls = []
    graph = nested_graph(calls).compile(checkpointer=answer_saver)
    paused = answered(graph, "nest", "src", {"text": "x"})
    assert calls == [("nest", "prepare")]
    head = fork(answer_saver, paused.config, "nest-fork")
    assert [i.value for i in graph.get_state(conf("nest-fork"), subgraphs=True).interrupts] \
        == ["inner question"]
    out = graph.invoke(Command(resume="ok"), head)
    assert out["text"] == "x+outer+prepared+ok"
    assert calls == [("nest", "prepare")]  # prepare ran once, on the source only
    assert graph.get_state(conf("nest")).values["text"] == "x+outer+prepared+src"


def test_fork_of_a_thread_still_waiting_inside_a_subgraph(answer_saver: Any) -> None:
    calls: Calls = []
    graph = nested_graph(calls).compile(checkpointer=answer_saver)
    graph.invoke({"text": "x"}, conf("wait"))
    head = fork(answer_saver, graph.get_state(conf("wait")).config, "wait-fork")
    assert graph.invoke(Command(resume="a"), head)["text"] == "x+outer+prepared+a"
    assert graph.invoke(Command(resume="b"), conf("wait"))["text"] == "x+outer+prepared+b"
    assert calls == [("wait", "prepare")]


@pytest.mark.parametrize("inner_kind", ["memory", "sqlite"])
def test_smart_reads_a_tasks_newest_answer_before_writing_it(inner_kind: str,
                                                              tmp_path: Path) -> None:
    inner = open_saver(inner_kind, tmp_path).saver
    smart = SmartCheckpointer(inner, Periodic(3600))
    try:
        graph = two_questions_graph([]).compile(checkpointer=smart)
        graph.invoke({"request": "r", "log": []}, conf("t"))
        graph.invoke(Command(resume="a"), conf("t"))  # the pause is written at once
        paused = graph.get_state(conf("t"))
        graph.invoke(Command(resume="b"), conf("t"))  # buffered: the answers replace theirs
        buffered = smart.get_tuple(paused.config).pending_writes
        smart.flush()
        assert smart.get_tuple(paused.config).pending_writes == buffered
        assert inner.get_tuple(paused.config).pending_writes == buffered
        assert [v for _, c, v in buffered if c == "__resume__"] == ["b", ["a", "b"]]
    finally:
        smart.close()
        inner.close()


async def test_rerun_refuses_a_new_answer_where_langgraph_replays_the_old(answer_saver: Any) -> None:
    from langgraph_ckpt_ext.timetravel import arerun, rerun

    calls: Calls = []
    graph = decision_graph(calls).compile(checkpointer=answer_saver)
    paused = answered(graph, "src", "yes")
    before = rows(answer_saver, "src")
    with pytest.raises(InvalidConfigError, match=r"answered already.*resume="):
        rerun(graph, paused.config, Command(resume="no"))
    with pytest.raises(InvalidConfigError, match="answered already"):
        await arerun(graph, paused.config, Command(resume="no"))
    assert rows(answer_saver, "src") == before and calls == [("src", "yes")]
