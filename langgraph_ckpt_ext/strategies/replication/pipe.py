"""The pipe between this process and the replicator process: length-prefixed pickles, and an
op's arguments as they are sent.

A put carries only the channels it writes. Its values were copied when the call came (see
`writes.Writer`); no list is sent as a tail of an earlier one, since what a replica stores is
decided from the values, never from which objects they are.

The pipe carries pickles between a parent and the child it started: nothing else writes to it.
"""

from __future__ import annotations

import pickle
import struct
from typing import IO, Any

from langgraph.checkpoint.base import get_serializable_checkpoint_metadata

_HEADER = struct.Struct("!I")


def send_frame(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _plain_config(config: Any) -> dict[str, Any]:
    """The ids a store reads from a config (a run's config also holds callbacks and the like,
    which neither pickle nor matter here)."""
    conf = config["configurable"]
    keep = {k: conf[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id") if k in conf}
    return {"configurable": keep}


def ship(kind: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """An op's arguments for the pipe. A put: its metadata as the store would make it from the
    run's config, and only the channels it writes."""
    if kind == "writes":
        return (_plain_config(args[0]), *args[1:])
    if kind != "put":
        return args
    config, checkpoint, metadata, new_versions = args
    values = checkpoint["channel_values"]
    sent = {ch: values[ch] for ch in new_versions if ch in values}
    metadata = get_serializable_checkpoint_metadata(config, metadata)
    return (_plain_config(config), {**checkpoint, "channel_values": sent}, metadata, new_versions)
