"""Where encryption keys come from: a `KeyProvider` names the key to seal new values with (per
tenant) and hands over any key by its id, so that values sealed under an older key stay
readable until they are rotated (`rotate_keys`).

Three providers: `StaticKeys` (keys given in code), `EnvKeys` (keys from the environment, as the
command line reads them) and `CallbackKeys` (a function per key id, e.g. a KMS that unwraps data
keys; results cached for a while). A key is 32 random bytes (`new_key()`); in text, base64.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from .errors import InvalidConfigError, UnknownKeyError

KEY_BYTES = 32
_KEY_ID = re.compile(r"[A-Za-z0-9_.:/@+-]{1,64}\Z")


@runtime_checkable
class KeyProvider(Protocol):
    """The keys a checkpointer seals and opens values with."""

    def current(self, tenant: str | None) -> str:
        """The id of the key new values of `tenant` (None: no tenant) are sealed with."""
        ...

    def key(self, key_id: str) -> bytes:
        """The key with this id (32 bytes); `UnknownKeyError` if there is none."""
        ...


def new_key() -> bytes:
    """A fresh random key (32 bytes)."""
    return secrets.token_bytes(KEY_BYTES)


def encode_key(key: bytes) -> str:
    """A key as text (base64), as `EnvKeys` reads it."""
    return base64.b64encode(key).decode("ascii")


def check_key_id(key_id: object) -> str:
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise InvalidConfigError(
            f"a key id is 1 to 64 letters, digits or _.:/@+- characters, not {key_id!r}")
    return key_id


def check_key(key: object, key_id: str) -> bytes:
    """A key given as 32 bytes or as their base64 text."""
    if isinstance(key, str):
        try:
            key = base64.b64decode(key.strip(), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidConfigError(f"key {key_id!r} is not base64 text: {exc}") from None
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        size = len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__
        raise InvalidConfigError(
            f"key {key_id!r} must be {KEY_BYTES} bytes (e.g. `new_key()`), not {size}")
    return bytes(key)


def _unknown(key_id: str, where: str) -> UnknownKeyError:
    return UnknownKeyError(
        f"no key {key_id!r} in {where}: a value sealed under it cannot be opened (was the key "
        "retired before every value under it was rotated? `rotate_keys` rewrites them)")


class StaticKeys:
    """Keys given in code: `{key_id: key}` (32 bytes, or base64 text), the id to seal with
    (`current`, default the last one given), and per-tenant current ids (`tenants`).

    Example:
        >>> keys = StaticKeys({"2026-11": old, "2026-12": new})  # doctest: +SKIP
    """

    def __init__(self, keys: Mapping[str, bytes | str], current: str | None = None,
                 tenants: Mapping[str, str] | None = None) -> None:
        if not keys:
            raise InvalidConfigError("StaticKeys needs at least one key")
        self._keys = {check_key_id(k): check_key(v, k) for k, v in keys.items()}
        self._current = current if current is not None else list(self._keys)[-1]
        self._tenants = dict(tenants or {})
        for kid in (self._current, *self._tenants.values()):
            if kid not in self._keys:
                raise InvalidConfigError(f"current key {kid!r} is not among the keys given")

    def current(self, tenant: str | None) -> str:
        if tenant is not None and tenant in self._tenants:
            return self._tenants[tenant]
        return self._current

    def key(self, key_id: str) -> bytes:
        try:
            return self._keys[key_id]
        except KeyError:
            raise _unknown(key_id, "StaticKeys") from None

    def __repr__(self) -> str:  # never the keys
        return f"StaticKeys(ids={list(self._keys)}, current={self._current!r})"


class EnvKeys(StaticKeys):
    """Keys from the environment: `LGCKPT_KEYS="id1:base64,id2:base64"` (the last is current
    unless `LGCKPT_KEY_CURRENT` names one). `prefix` renames the variables (`<prefix>_KEYS`)."""

    def __init__(self, prefix: str = "LGCKPT", environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get(f"{prefix}_KEYS", "").strip()
        if not raw:
            raise InvalidConfigError(
                f"no keys in ${prefix}_KEYS (expected 'id:base64key,...'; make one with "
                "`lgckpt new-key`)")
        keys: dict[str, str] = {}
        for part in raw.split(","):
            kid, sep, text = part.strip().partition(":")
            if not sep:
                raise InvalidConfigError(
                    f"${prefix}_KEYS: {kid[:8]!r}... is not 'id:base64key'")
            keys[kid.strip()] = text.strip()
        super().__init__(keys, env.get(f"{prefix}_KEY_CURRENT") or None)


class CallbackKeys:
    """Keys fetched by a function of their id, such as a KMS unwrapping a data key; each is
    cached for `cache_seconds`. `current`: the id to seal new values with, or a function of
    the tenant giving it."""

    def __init__(self, fetch: Callable[[str], bytes],
                 current: str | Callable[[str | None], str],
                 cache_seconds: float = 300.0) -> None:
        self._fetch = fetch
        self._current = current
        self._ttl = cache_seconds
        self._cache: dict[str, tuple[float, bytes]] = {}
        self._lock = threading.Lock()

    def current(self, tenant: str | None) -> str:
        return self._current if isinstance(self._current, str) else self._current(tenant)

    def key(self, key_id: str) -> bytes:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key_id)
            if hit is not None and hit[0] > now:
                return hit[1]
        try:
            raw = self._fetch(key_id)
        except (KeyError, LookupError):
            raise _unknown(key_id, "the key callback") from None
        if raw is None:
            raise _unknown(key_id, "the key callback")
        key = check_key(raw, key_id)
        with self._lock:
            self._cache[key_id] = (now + self._ttl, key)
        return key
