"""Benchmark: what a put pays per message to encode a message list (no storage).

A thread of N messages (~500 bytes each, as in bench_backends.py), one new message per put:
  whole      LangGraph's serializer on the whole list (what its savers do at every put);
  marks      only checking the items' types and pickled states, a chunk of sixteen at a
             time (`codec.chunk_mark`);
  item reuse `codec.encode_items` on top of the list encoded before (our puts, and
             SmartCheckpointer's frozen values): unchanged items keep their bytes.
Prints microseconds per message and the ratio to `whole`. Run: python benchmarks/bench_list_encoding.py
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_ckpt_ext.core import codec

sys.path.insert(0, str(Path(__file__).parent))
from bench_backends import text  # the benchmark's ~500-byte prose


def thread(turns: int) -> list[Any]:
    serde = JsonPlusSerializer()
    msgs: list[Any] = []
    for k in range(turns):
        msgs += [HumanMessage(text(f"q{k}"), id=f"{k}h"),
                 AIMessage(text(f"t{k}"), id=f"{k}c",
                           tool_calls=[{"name": "search", "args": {"q": "x"}, "id": f"{k}c"}]),
                 ToolMessage(text(f"r{k}"), tool_call_id=f"{k}c", id=f"{k}t")]
    return serde.loads_typed(serde.dumps_typed(msgs))  # as a graph holds them after a read


def main() -> None:
    serde = JsonPlusSerializer()
    for turns in (10, 50):
        msgs = thread(turns)
        last = codec.encode_items(serde, msgs[:-1], None, "m")
        cases = {
            "whole": lambda msgs=msgs: serde.dumps_typed(msgs),
            "marks": lambda msgs=msgs: [codec.chunk_mark(msgs[i:i + codec._CHUNK])
                                        for i in range(0, len(msgs), codec._CHUNK)],
            "item reuse": lambda msgs=msgs, last=last: codec.encode_items(serde, msgs, last, "m"),
        }
        per: dict[str, float] = {}
        for name, fn in cases.items():
            best = min(timeit.repeat(fn, number=100, repeat=7)) / 100
            per[name] = best / len(msgs) * 1e6
        print(f"{len(msgs)} messages: " + ", ".join(
            f"{k} {v:.2f} us/msg ({v / per['whole']:.2f}x)" for k, v in per.items()))


if __name__ == "__main__":
    main()
