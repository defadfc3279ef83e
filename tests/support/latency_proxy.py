"""A TCP proxy on a free loopback port that delays every chunk it forwards by a random 1-10 ms
(each direction keeps its order), so that tests meet the interleavings of a real network."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: tuple[float, float]) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(chunk)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    last = 0.0
    try:
        while True:
            chunk = await reader.read(65536)
            # Later chunks never overtake earlier ones: each is due after the one before.
            last = max(last, loop.time() + random.uniform(*delay))
            queue.put_nowait((last, chunk))
            if not chunk:
                break
        await sender
    except (ConnectionError, OSError):
        pass
    finally:
        sender.cancel()
        writer.close()


@contextlib.asynccontextmanager
async def latency_proxy(host: str, port: int, delay: tuple[float, float] = (0.001, 0.010)
                        ) -> AsyncIterator[int]:
    """Serve on 127.0.0.1 (a free port, yielded) for as long as the context is open, on the
    running event loop."""
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        pumps = [asyncio.create_task(_pump(reader, up_writer, delay)),
                 asyncio.create_task(_pump(up_reader, writer, delay))]
        tasks.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)
        tasks.difference_update(pumps)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
