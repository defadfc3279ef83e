"""Reading `RunnableConfig` values the way every backend needs them, and the one rule every id
must follow before anything is stored or read.

The rule (`check_id`), the same on every backend: an id is text that encodes as UTF-8 (no lone
surrogate), holds no NUL character, and takes at most `MAX_ID_BYTES` bytes in UTF-8. PostgreSQL
refuses NUL in text and index entries past about 2.7 kB (a pending write's key holds four ids);
Redis joins ids with NUL inside fields; SQLite would take anything, and then no other backend
could hold a copy of the thread. Checked on entry, so a refused call has written nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig

from .errors import InvalidConfigError

MAX_ID_BYTES = 512
"""The most UTF-8 bytes an id may take (thread, namespace, checkpoint, task, channel, run)."""
_PLAIN = MAX_ID_BYTES // 4  # characters that cannot take more than MAX_ID_BYTES in UTF-8


def check_id(value: object, field: str, *, required: bool = False) -> str:
    """`value` as an id (its `str`), or `InvalidConfigError` naming `field` (see module doc);
    `required`: the empty string is refused too."""
    text = value if isinstance(value, str) else str(value)
    if _plain(text):
        if required and not text:
            raise InvalidConfigError(f"{field} is empty: it must name something")
        return text
    if "\0" in text:
        raise InvalidConfigError(f"{field} {_shown(text)} holds a NUL character, which no "
                                 "backend can store: remove it")
    if len(text) > MAX_ID_BYTES:  # every character takes at least one byte
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidConfigError(
                f"{field} {_shown(text)} is not valid Unicode text (a lone surrogate): ids "
                "must encode as UTF-8"
            ) from None
    if size > MAX_ID_BYTES:
        raise InvalidConfigError(
            f"{field} {_shown(text)} takes {size} bytes in UTF-8; an id may take at most "
            f"{MAX_ID_BYTES} (use a shorter id, or a hash of this one)"
        )
    return text


def _plain(text: str) -> bool:
    """The common case, settled without encoding: short ASCII without NUL."""
    return len(text) <= _PLAIN and text.isascii() and "\0" not in text


def _shown(text: str) -> str:
    """An id as an error message quotes it: a long one cut short."""
    return repr(text) if len(text) <= 80 else f"{text[:60]!r}... ({len(text)} characters)"


def check_ids(values: Iterable[object], field: str, *, required: bool = False) -> list[str]:
    """Each of `values` as an id (`check_id`), all checked before any is used."""
    return [check_id(v, field, required=required) for v in values]


def _configurable(config: RunnableConfig | None) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise InvalidConfigError(
            f"expected a RunnableConfig dict, got {type(config).__name__}; "
            'pass {"configurable": {"thread_id": ...}}'
        )
    conf = config.get("configurable")
    return conf if isinstance(conf, dict) else {}


def thread_id_of(config: RunnableConfig | None) -> str:
    """The config's `thread_id` as a string; `InvalidConfigError` when it is missing or breaks
    the id rule."""
    tid = _configurable(config).get("thread_id")
    if tid is None or tid == "":
        raise InvalidConfigError(
            "config['configurable']['thread_id'] is missing: a checkpointer stores state per "
            'thread, so call the graph with {"configurable": {"thread_id": "<some id>"}}'
        )
    return check_id(tid, "thread_id")


def checkpoint_ns_of(config: RunnableConfig | None) -> str:
    ns = _configurable(config).get("checkpoint_ns")
    return "" if ns is None else check_id(ns, "checkpoint_ns")


def checkpoint_id_of(config: RunnableConfig | None) -> str | None:
    cid = _configurable(config).get("checkpoint_id")
    return None if cid in (None, "") else check_id(cid, "checkpoint_id")


def writes_checkpoint_of(config: RunnableConfig | None) -> str:
    """The checkpoint that `put_writes` writes to; `InvalidConfigError` when it is missing."""
    cid = checkpoint_id_of(config)
    if cid is None:
        raise InvalidConfigError(
            "put_writes needs config['configurable']['checkpoint_id']: the checkpoint "
            "these writes belong to (the config that put returned)"
        )
    return cid


def put_ids(
    config: RunnableConfig | None,
    checkpoint: Mapping[str, Any],
    metadata: Mapping[str, Any],
    new_versions: Mapping[str, Any],
) -> tuple[str, str, str, str | None]:
    """`(thread_id, checkpoint_ns, checkpoint_id, parent_id)` of a `put`, once every id it
    stores is checked: the config's, the checkpoint's own, the run's (`metadata` as stored),
    and its channels' names and (text) versions."""
    ids = (thread_id_of(config), checkpoint_ns_of(config),
           check_id(checkpoint.get("id", ""), "checkpoint['id']", required=True),
           checkpoint_id_of(config))
    run_id = metadata.get("run_id")
    if run_id is not None:
        check_id(run_id, "metadata run_id")
    versions = checkpoint.get("channel_versions") or {}
    for channel, version in versions.items():
        _check_channel(channel, version)
    for channel in new_versions.keys() - versions.keys():
        _check_channel(channel, new_versions[channel])
    return ids


def write_ids(
    config: RunnableConfig | None,
    writes: Sequence[tuple[Any, Any]],
    task_id: object,
    task_path: object,
) -> tuple[str, str, str, str]:
    """`(thread_id, checkpoint_ns, checkpoint_id, task_id)` of a `put_writes`, once every id it
    stores is checked: the config's, the task's id and path, and the channels written."""
    ids = (thread_id_of(config), checkpoint_ns_of(config), writes_checkpoint_of(config),
           check_id(task_id, "task_id"))
    check_id(task_path, "task_path")
    for channel, _ in writes:
        _check_channel(channel)
    return ids


def _check_channel(channel: object, version: object = None) -> None:
    """A channel's name, and its version if text (numbers are always fine)."""
    if not isinstance(channel, str):
        raise InvalidConfigError(f"channel name {channel!r} is a {type(channel).__name__}, "
                                 "not a string")
    if not _plain(channel):
        check_id(channel, "channel name")
    if isinstance(version, str) and not _plain(version):
        check_id(version, f"version of channel {channel!r}")


def make_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }
