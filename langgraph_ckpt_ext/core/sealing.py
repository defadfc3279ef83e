"""Values sealed at rest: compressed (zstd), then encrypted with authenticated encryption bound
to the row that holds them (pure; no I/O).

A sealed value is stored with the type tag `"lgx"` and these bytes (the envelope):

    b"LGX\\x01"                    magic and format version
    flags                          1 byte: bit 0 encrypted; bits 4-7 the codec (0 none, 1 zstd)
    [encrypted only:]
      algorithm                    1 byte: 1 AES-256-GCM, 2 ChaCha20-Poly1305
      key id                       1 byte length, UTF-8
      tenant                       1 byte length, UTF-8 (empty: none)
      nonce                        12 random bytes
    payload                        the inner part, encrypted (with its 16-byte tag) or not

    inner = 1 byte length + the serializer's type tag, then its bytes (compressed by the codec)

The associated data of the encryption is the envelope's header (so its key id, tenant and
codec cannot be changed) followed by the row's identity, length-framed: what kind of value it
is and its key (thread, namespace and checkpoint id; channel, version and delta base; task id,
index and channel: see `checkpoint_id_of` and siblings). A value moved to another row, thread,
version or kind fails to open, and the error names the row it was found in.

Compression alone (no encryption) uses the same envelope unencrypted; a value under the size
threshold, or that does not shrink, is stored as it is. Decompression stops at a bound
(`max_value_bytes`) so a crafted row cannot exhaust memory.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import (
    DecompressionLimitError,
    DecryptionError,
    InvalidConfigError,
    PlaintextRefusedError,
    UnknownKeyError,
    require,
)
from .keys import KeyProvider
from .rows import Typed

SEALED = "lgx"
"""The type tag of a sealed value."""

_MAGIC = b"LGX\x01"
_ENCRYPTED = 0x01
_ZSTD = 0x10
_ALGORITHMS = {"aes-256-gcm": 1, "chacha20-poly1305": 2}
_NONCE = 12
DEFAULT_MAX_VALUE_BYTES = 256 << 20

Identity = tuple[str, ...]
"""What a sealed value is bound to: its kind ("C" checkpoint record, "M" metadata, "B" blob,
"W" pending write) then its row key (see the builders below)."""


def checkpoint_identity(thread_id: str, ns: str, checkpoint_id: str) -> Identity:
    return ("C", thread_id, ns, checkpoint_id)


def metadata_identity(thread_id: str, ns: str, checkpoint_id: str) -> Identity:
    return ("M", thread_id, ns, checkpoint_id)


def blob_identity(thread_id: str, ns: str, channel: str, version: str,
                  base_version: str | None) -> Identity:
    return ("B", thread_id, ns, channel, version, base_version or "")


def write_identity(thread_id: str, ns: str, checkpoint_id: str, task_id: str, idx: int,
                   channel: str) -> Identity:
    return ("W", thread_id, ns, checkpoint_id, task_id, str(idx), channel)


def describe(ident: Identity | str) -> str:
    """The row an identity names, for error messages (a string: already described)."""
    if isinstance(ident, str):
        return ident
    kind, tid, ns = ident[0], ident[1], ident[2]
    where = f"of thread {tid!r}" + (f" (namespace {ns!r})" if ns else "")
    if kind == "C":
        return f"checkpoint {ident[3]!r} {where}"
    if kind == "M":
        return f"the metadata of checkpoint {ident[3]!r} {where}"
    if kind == "B":
        base = f" (an append-delta on {ident[5]!r})" if ident[5] else ""
        return f"channel {ident[3]!r} at version {ident[4]!r}{base} {where}"
    return (f"write {ident[5]} of task {ident[4]!r} to channel {ident[6]!r} at checkpoint "
            f"{ident[3]!r} {where}")


def _frame(parts: Identity) -> bytes:
    encoded = [part.encode("utf-8", "surrogatepass") for part in parts]
    return b"".join(len(p).to_bytes(4, "big") + p for p in encoded)


@dataclass(frozen=True)
class Compression:
    """Compress stored values with zstd (the `zstd` extra): values of `min_size` bytes or more,
    at `level`; a value that does not shrink is stored as it is. `max_value_bytes`: the most a
    stored value may decompress to (a larger one is refused, `DecompressionLimitError`)."""

    min_size: int = 1024
    level: int = 3
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES

    def __post_init__(self) -> None:
        for name in ("min_size", "level", "max_value_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (
                    1 if name != "min_size" else 0):
                raise InvalidConfigError(f"Compression({name}=...) must be a positive integer, "
                                         f"not {value!r}")
        if self.level > 22:
            raise InvalidConfigError(f"zstd levels go up to 22, not {self.level}")


@dataclass(frozen=True)
class Encryption:
    """Encrypt every stored value, pending write and metadata, bound to its row (see
    `core.sealing`), with the `cryptography` extra.

    Args:
        keys: where keys come from (`StaticKeys`, `EnvKeys`, `CallbackKeys`, or your own
            `KeyProvider`); new values are sealed with `keys.current(tenant)`.
        algorithm: `"aes-256-gcm"` (default) or `"chacha20-poly1305"`.
        plaintext: `"refuse"` (default): a value stored unencrypted is an error
            (`PlaintextRefusedError`); `"read"`: read it (while encrypting an existing store;
            `rotate_keys` then encrypts it in place).
        tenant: how a run names its tenant, whose current key seals what it writes: a key of
            the config's `configurable` (e.g. `"tenant_id"`) or a function of the config.
            None: one current key for all.
        lazy_rotation: re-seal, at the thread's next write, the values this process read
            under an older key (or unencrypted, with `plaintext="read"`).
    """

    keys: KeyProvider
    algorithm: str = "aes-256-gcm"
    plaintext: str = "refuse"
    tenant: str | Callable[[Mapping[str, Any]], str | None] | None = None
    lazy_rotation: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.keys, KeyProvider):
            raise InvalidConfigError(
                f"Encryption(keys=...) takes a KeyProvider (StaticKeys, EnvKeys, "
                f"CallbackKeys), not {type(self.keys).__name__}")
        if self.algorithm not in _ALGORITHMS:
            raise InvalidConfigError(f"algorithm must be one of {sorted(_ALGORITHMS)}, not "
                                     f"{self.algorithm!r}")
        if self.plaintext not in ("refuse", "read"):
            raise InvalidConfigError(f"plaintext must be 'refuse' or 'read', not "
                                     f"{self.plaintext!r}")

    def tenant_of(self, config: Mapping[str, Any] | None) -> str | None:
        """The tenant a config names (None: none, or no tenant rule)."""
        if self.tenant is None or config is None:
            return None
        if callable(self.tenant):
            found = self.tenant(config)
        else:
            found = (config.get("configurable") or {}).get(self.tenant)
        return None if found is None else str(found)


@dataclass(frozen=True, slots=True)
class Opened:
    """A value opened: the serializer's (type, bytes), and whether it should be sealed again
    (under an older key than its tenant's current one, or not encrypted while encryption is
    on), with the tenant it was sealed for."""

    typed: Typed
    stale: bool = False
    tenant: str | None = None


@dataclass
class Sealer:
    """Seals values for their rows and opens them (see the module docstring)."""

    encryption: Encryption | None = None
    compression: Compression | None = None
    _ciphers: dict[tuple[int, str], Any] = field(default_factory=dict, repr=False)
    _zstd: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.encryption is not None:
            aead = require("cryptography.hazmat.primitives.ciphers.aead", "encryption",
                           what="encryption")
            self._aead = aead
            self._alg = _ALGORITHMS[self.encryption.algorithm]
            self._invalid_tag = require("cryptography.exceptions", "encryption").InvalidTag
            self.encryption.keys.key(self.encryption.keys.current(None))  # fail now, not later
        if self.compression is not None:
            self._zstd = require("zstandard", "zstd", what="compression")
        self._local = threading.local()  # zstd (de)compressors are not thread-safe
        self._limit = (self.compression.max_value_bytes if self.compression is not None
                       else DEFAULT_MAX_VALUE_BYTES)

    def _compressor(self) -> Any:
        made = getattr(self._local, "compressor", None)
        if made is None:
            assert self.compression is not None
            made = self._local.compressor = self._zstd.ZstdCompressor(
                level=self.compression.level, write_checksum=True)
        return made

    def _decompressor(self) -> Any:
        made = getattr(self._local, "decompressor", None)
        if made is None:
            made = self._local.decompressor = self._zstd.ZstdDecompressor()
        return made

    @property
    def active(self) -> bool:
        return self.encryption is not None or self.compression is not None

    def _cipher(self, alg: int, key_id: str) -> Any:
        cipher = self._ciphers.get((alg, key_id))
        if cipher is None:
            assert self.encryption is not None
            make = self._aead.AESGCM if alg == 1 else self._aead.ChaCha20Poly1305
            cipher = self._ciphers[(alg, key_id)] = make(self.encryption.keys.key(key_id))
        return cipher

    # -- sealing ---------------------------------------------------------------------------

    def seal(self, typed: Typed, ident: Identity, tenant: str | None = None) -> Typed:
        """`typed` as stored for the row `ident` names."""
        type_, data = typed
        codec = 0
        body = bytes(data)
        comp = self.compression
        if comp is not None and len(body) >= comp.min_size:
            packed = self._compressor().compress(body)
            if len(packed) < len(body):
                body, codec = packed, _ZSTD
        enc = self.encryption
        if enc is None and not codec:
            return typed  # nothing to do: stored as it is
        tag = type_.encode("utf-8")
        inner = bytes((len(tag),)) + tag + body
        if enc is None:
            return SEALED, _MAGIC + bytes((codec,)) + inner
        kid = enc.keys.current(tenant)
        kid_b = kid.encode("utf-8")
        ten_b = (tenant or "").encode("utf-8")[:255]
        header = (_MAGIC + bytes((codec | _ENCRYPTED, self._alg, len(kid_b))) + kid_b
                  + bytes((len(ten_b),)) + ten_b + os.urandom(_NONCE))
        sealed = self._cipher(self._alg, kid).encrypt(header[-_NONCE:], inner, header + _frame(ident))
        return SEALED, header + sealed

    # -- opening ---------------------------------------------------------------------------

    def open(self, typed: Typed, ident: Identity) -> Opened:
        """The value stored as `typed` in the row `ident` names, checked and opened."""
        type_, data = typed
        enc = self.encryption
        if type_ != SEALED:
            if enc is not None:
                if enc.plaintext == "refuse":
                    raise PlaintextRefusedError(
                        f"{describe(ident)} is stored unencrypted, and encryption is on "
                        "(plaintext='refuse'). If the store predates encryption, open it with "
                        "Encryption(..., plaintext='read') and run rotate_keys() to encrypt it "
                        "in place; otherwise the row was written by someone without the key")
                return Opened(typed, stale=True)
            return Opened(typed)
        data = bytes(data)
        if len(data) < 6 or data[:4] != _MAGIC:
            raise DecryptionError(f"{describe(ident)} is not a sealed value of a format this "
                                  "version knows (bad magic)")
        flags = data[4]
        codec = flags & 0xF0
        if not flags & _ENCRYPTED:
            if enc is not None and enc.plaintext == "refuse":
                raise PlaintextRefusedError(
                    f"{describe(ident)} is compressed but not encrypted, and encryption is on "
                    "(plaintext='refuse'): see Encryption(plaintext='read') and rotate_keys()")
            return Opened(self._inner(data[5:], codec, ident), stale=enc is not None)
        if enc is None:
            raise DecryptionError(
                f"{describe(ident)} is encrypted: open the checkpointer with "
                "encryption=Encryption(keys=...) holding its key")
        try:
            alg, kid_len = data[5], data[6]
            pos = 7 + kid_len
            kid = data[7:pos].decode("utf-8")
            ten_len = data[pos]
            tenant = data[pos + 1:pos + 1 + ten_len].decode("utf-8") or None
            pos += 1 + ten_len
            nonce = data[pos:pos + _NONCE]
            pos += _NONCE
            if len(nonce) != _NONCE or len(data) < pos + 16:
                raise ValueError("short")
        except (IndexError, ValueError, UnicodeDecodeError):
            raise DecryptionError(f"{describe(ident)}: its envelope is truncated or malformed"
                                  ) from None
        if alg not in _ALGORITHMS.values():
            raise DecryptionError(f"{describe(ident)} is sealed with an unknown algorithm "
                                  f"({alg})")
        try:
            cipher = self._cipher(alg, kid)
        except UnknownKeyError as exc:
            raise UnknownKeyError(f"{describe(ident)} is sealed under key {kid!r}: {exc}"
                                  ) from None
        try:
            inner = cipher.decrypt(nonce, data[pos:], data[:pos] + _frame(ident))
        except self._invalid_tag:
            raise DecryptionError(
                f"cannot decrypt {describe(ident)} with key {kid!r}: the value stored there "
                "was sealed for another row, thread or version (moved or copied there), or "
                "was altered, or the key under that id is not the one it was sealed with"
            ) from None
        stale = kid != enc.keys.current(tenant)
        return Opened(self._inner(inner, codec, ident), stale=stale, tenant=tenant)

    def _inner(self, inner: bytes, codec: int, ident: Identity | str) -> Typed:
        if not inner or len(inner) < 1 + inner[0]:
            raise DecryptionError(f"{describe(ident)}: its sealed value is truncated")
        type_ = inner[1:1 + inner[0]].decode("utf-8", "replace")
        body = inner[1 + inner[0]:]
        if codec == _ZSTD:
            body = self._decompress(body, ident)
        elif codec:
            raise DecryptionError(f"{describe(ident)} is compressed with an unknown codec "
                                  f"({codec >> 4})")
        return type_, body

    def _decompress(self, body: bytes, ident: Identity | str) -> bytes:
        if self._zstd is None:
            self._zstd = require("zstandard", "zstd", what="a compressed value")
        zstd = self._zstd
        limit = self._limit
        try:
            declared = zstd.frame_content_size(body)
        except zstd.ZstdError as exc:
            raise DecryptionError(f"{describe(ident)}: its compressed value is corrupt: {exc}"
                                  ) from None
        if declared > limit:
            raise _too_large(ident, declared, limit)
        out = io.BytesIO()
        try:
            with self._decompressor().stream_reader(body) as reader:
                while True:
                    chunk = reader.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
                    if out.tell() > limit:
                        raise _too_large(ident, None, limit)
        except zstd.ZstdError as exc:
            raise DecryptionError(f"{describe(ident)}: its compressed value is corrupt: {exc}"
                                  ) from None
        if declared >= 0 and out.tell() != declared:  # cut short (zstd keeps no checksum here)
            raise DecryptionError(f"{describe(ident)}: its compressed value is truncated")
        return out.getvalue()


def _too_large(ident: Identity | str, declared: int | None, limit: int) -> DecompressionLimitError:
    size = f"{declared} bytes" if declared is not None else "more"
    return DecompressionLimitError(
        f"{describe(ident)} decompresses to {size}, past the bound of {limit} bytes "
        "(Compression(max_value_bytes=...)): refused")


def key_id_of(typed: Typed) -> str:
    """The key id a stored value is sealed under ("" if it is not encrypted)."""
    type_, data = typed
    data = bytes(data)
    if type_ != SEALED or len(data) < 7 or data[:4] != _MAGIC or not data[4] & _ENCRYPTED:
        return ""
    return data[7:7 + data[6]].decode("utf-8", "replace")


_UNKEYED = Sealer()


def open_unencrypted(typed: Typed, what: str) -> Typed:
    """A sealed value read by a checkpointer that seals nothing: a compressed one opens (under
    the default bound), an encrypted one is refused with what to do."""
    data = bytes(typed[1])
    if len(data) >= 5 and data[:4] == _MAGIC and not data[4] & _ENCRYPTED:
        return _UNKEYED._inner(data[5:], data[4] & 0xF0, what)
    raise DecryptionError(f"{what} is encrypted: open the checkpointer with "
                          "encryption=Encryption(keys=...) holding its key")
