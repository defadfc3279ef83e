"""Secrets kept out of checkpoint metadata.

LangGraph copies the scalar values of a run's `configurable` into each checkpoint's metadata
(so that `list(filter=...)` can find them): an `api_key` passed in a config would be stored in
the clear, in every checkpoint, and printed by whatever shows metadata. A key is a secret when
one of its words (split at `_`, `-`, `.`, spaces and camelCase humps) is a secret word
(`token`, `secret`, `password`, ...), or its words hold a secret pair (`api key`, `private
key`, `access key`, `client secret`, `session id`): `api_key`, `X-Api-Key`, `accessToken`,
`Authorization`, `db_password` are; `max_tokens`, `author`, `keyword` are not.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_WORDS = frozenset({
    "token", "secret", "password", "passwd", "pwd", "passphrase", "authorization", "auth",
    "credential", "credentials", "apikey", "cookie", "jwt", "bearer", "signature",
})
SECRET_PAIRS = frozenset({
    ("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"),
    ("client", "secret"), ("session", "id"), ("session", "key"), ("signing", "key"),
})
REDACTED = "***"

_HUMPS = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^a-z0-9]+")


def words(key: str) -> list[str]:
    """A key's words, lower case: `X-Api-Key` -> x, api, key; `accessToken` -> access, token."""
    return [w for w in _SPLIT.split(_HUMPS.sub("_", key).lower()) if w]


class Redaction:
    """Which metadata keys are secrets: the default words and pairs (unless `defaults` is
    False) and `extra`, more key names (matched whole, case and separators ignored: `"tenant
    key"` matches `TenantKey` and `tenant-key`) or words."""

    def __init__(self, extra: Iterable[str] = (), *, defaults: bool = True) -> None:
        if isinstance(extra, str):
            raise TypeError("redact takes a list of key names, not one string")
        self.names: set[tuple[str, ...]] = set()
        for name in extra:
            if not isinstance(name, str) or not words(name):
                raise ValueError(f"a key name to redact must be a non-empty string: {name!r}")
            self.names.add(tuple(words(name)))
        self.words = SECRET_WORDS if defaults else frozenset()
        self.pairs = SECRET_PAIRS if defaults else frozenset()
        # Answers per key: a run's checkpoints carry the same few keys at every step.
        self._known: dict[str, bool] = {}

    def secret(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        known = self._known.get(key)
        if known is None:
            if len(self._known) >= 4096:  # keys made up per run: start again, never grow
                self._known.clear()
            known = self._known[key] = self._judge(key)
        return known

    def _judge(self, key: str) -> bool:
        ws = words(key)
        if tuple(ws) in self.names or any(w in self.words for w in ws):
            return True
        if any((w,) in self.names for w in ws):
            return True
        return any(pair in self.pairs for pair in itertools.pairwise(ws))

    def drop(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """`metadata` without its secret keys (top level: where LangGraph copies them)."""
        return {k: v for k, v in metadata.items() if not self.secret(k)}

    def mask(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """`metadata` with its secret values shown as `***` (for display of rows stored
        before redaction, or by another saver)."""
        return {k: REDACTED if self.secret(k) else v for k, v in metadata.items()}


DEFAULT = Redaction()


def redaction(redact: bool | Iterable[str]) -> Redaction | None:
    """A checkpointer's `redact` option as its rule (None: nothing redacted)."""
    if redact is True:
        return DEFAULT
    if redact is False:
        return None
    return Redaction(redact)
