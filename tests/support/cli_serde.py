"""A custom serializer for `lgckpt --serde` tests: LangGraph's, its bytes XORed under a type
tag of its own, so that a store written with it cannot be read without it."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

_KEY = 0x5A
_TAG = "xor+"


class XorSerde:
    def __init__(self) -> None:
        self._inner = JsonPlusSerializer()

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = self._inner.dumps_typed(obj)
        return _TAG + type_, bytes(b ^ _KEY for b in data)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, raw = data
        if not type_.startswith(_TAG):
            raise ValueError(f"not written by XorSerde (type {type_!r})")
        return self._inner.loads_typed((type_[len(_TAG):], bytes(b ^ _KEY for b in raw)))


SERDE = XorSerde()
"""An object, for `--serde tests.support.cli_serde:SERDE`; the class is a factory too."""
