"""A factory of one's own: name it in langgraph.json as
`"checkpointer": {"path": "./custom_checkpointer.py:checkpointer"}`.

It wraps our checkpointer in a `SmartCheckpointer` (writes at interrupts, errors and the end
of runs, batched), encrypts stored values with the keys in $LGCKPT_KEYS, and keeps at most
the 50 newest checkpoints of each thread on top of the ttl of langgraph.json."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from langgraph.checkpoint.base import BaseCheckpointSaver

from langgraph_ckpt_ext import Encryption, EnvKeys, Retention, SmartCheckpointer
from langgraph_ckpt_ext.server import ServerSettings, open_checkpointer


@asynccontextmanager
async def checkpointer() -> AsyncIterator[BaseCheckpointSaver]:
    settings = ServerSettings.from_env()  # LGCKPT_URL, and langgraph.json's ttl and serde
    async with open_checkpointer(
        settings,
        wrap=SmartCheckpointer,
        encryption=Encryption(EnvKeys()),
        retention=Retention(idle=30 * 24 * 3600, keep=50),
    ) as saver:
        yield saver
