"""A throwaway Redis Sentinel setup for tests: a master, its replicas and three sentinels, every
process started here on a free loopback port (see `redis_servers`, whose servers these are).

The sentinels watch the master under `SERVICE` with a quorum of 2, `down-after-milliseconds`
`DOWN_AFTER_MS` and `failover-timeout` `FAILOVER_TIMEOUT_MS`, so that a failover completes in a
few seconds. A sentinel rewrites its configuration file: each gets a writable one in its own
directory. On exit every process started here is stopped (a paused one resumed first) and every
directory removed; nothing here signals a process it did not start.
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.redis_servers import (
    HOST,
    RedisServer,
    RedisServerError,
    _executable,
    _remove_dirs,
    _spawn,
    free_port,
    start_on_free_port,
)
from tests.support.tcp_link import HeldLink

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
READY_TIMEOUT = 30.0
"""Seconds the setup gets to be ready: replicas in sync, every sentinel knowing the others."""


class SentinelServer(RedisServer):
    """A `redis-server <conf> --sentinel` process watching `SERVICE` at `master_port`."""

    def __init__(self, port: int, directory: Path, master_port: int,
                 failover_timeout_ms: int = FAILOVER_TIMEOUT_MS) -> None:
        super().__init__(port, directory)
        self.master_port = master_port
        self.failover_timeout_ms = failover_timeout_ms
        self.conf = directory / "sentinel.conf"

    def command(self) -> list[str]:
        if not self.conf.exists():  # written once: the sentinel rewrites it as it learns
            self.conf.write_text(
                f"port {self.port}\nbind {HOST}\ndir {self.dir}\ndaemonize no\n"
                f"sentinel monitor {SERVICE} {HOST} {self.master_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n")
        return [_executable("redis-server"), str(self.conf), "--sentinel"]


def signal_server(server: RedisServer, sig: signal.Signals) -> None:
    """Send `sig` (SIGKILL, SIGSTOP, SIGCONT) to the server's current process, which this
    harness started."""
    if server._proc is None or server._proc.poll() is not None:
        raise RedisServerError(f"{server!r} is not running")
    server._proc.send_signal(sig)
    if sig == signal.SIGKILL:
        server._proc.wait(10)


@dataclass
class SentinelSetup:
    """A running master, its replicas and sentinels, every process on 127.0.0.1."""

    master: RedisServer
    replicas: list[RedisServer]
    sentinels: list[SentinelServer] = field(default_factory=list)
    paused: set[RedisServer] = field(default_factory=set)
    links: list[HeldLink] = field(default_factory=list)
    """The first replica's link to the master, when started with `held_link`."""

    @property
    def url(self) -> str:
        """`redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,.../SERVICE/0`."""
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """`(host, port)` of each sentinel, for `redis.asyncio.sentinel.Sentinel`."""
        return [(s.host, s.port) for s in self.sentinels]

    def current_master(self) -> int | None:
        """The master's port as a majority of the sentinels name it (None: no majority)."""
        named: list[int] = []
        for s in self.sentinels:
            with contextlib.suppress(Exception), s.client() as c:
                host_port = c.execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
                named.append(int(host_port[1]))
        best = max(set(named), key=named.count, default=None)
        return best if best is not None and named.count(best) >= 2 else None

    def kill_master(self) -> RedisServer:
        """SIGKILL the master: no shutdown, nothing more sent to its replicas."""
        signal_server(self.master, signal.SIGKILL)
        return self.master

    def pause(self, server: RedisServer) -> None:
        signal_server(server, signal.SIGSTOP)
        self.paused.add(server)

    def resume(self, server: RedisServer) -> None:
        signal_server(server, signal.SIGCONT)
        self.paused.discard(server)

    def wait_failover(self, timeout: float = 30.0) -> RedisServer:
        """Wait until a majority of the sentinels names a replica as master and that replica
        answers as one; return it."""
        old = self.master.port
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.current_master()
            new = next((r for r in self.replicas if r.port == port and port != old), None)
            if new is not None and _role(new) == "master":
                self.master = new
                self.replicas.remove(new)
                return new
            time.sleep(0.1)
        raise RedisServerError(f"no failover within {timeout:.0f}s (master {old})")


def _role(server: RedisServer) -> str | None:
    with contextlib.suppress(Exception), server.client() as c:
        return str(c.info("replication").get("role"))
    return None


def _ready(setup: SentinelSetup) -> bool:
    with setup.master.client() as c:
        if int(c.info("replication").get("connected_slaves", 0)) < len(setup.replicas):
            return False
    for r in setup.replicas:
        with r.client() as c:
            if c.info("replication").get("master_link_status") != "up":
                return False
    for s in setup.sentinels:
        with s.client() as c:
            state: Any = c.execute_command("SENTINEL", "master", SERVICE)
            info = dict(zip(state[::2], state[1::2], strict=True)) if isinstance(state, list) \
                else state
            others = int(info.get(b"num-other-sentinels", info.get("num-other-sentinels", 0)))
            slaves = int(info.get(b"num-slaves", info.get("num-slaves", 0)))
            if others < len(setup.sentinels) - 1 or slaves < len(setup.replicas):
                return False
    return True


def _spawn_sentinel(master_port: int, dirs: list[Path], failover_timeout_ms: int
                    ) -> SentinelServer:
    def make() -> SentinelServer:
        directory = Path(tempfile.mkdtemp(prefix="redis-sentinel-"))
        dirs.append(directory)
        return SentinelServer(free_port(), directory, master_port, failover_timeout_ms)

    return start_on_free_port(make)


@contextlib.contextmanager
def redis_sentinel(replicas: int = 1, sentinels: int = 3, master_args: Sequence[str] = (),
                   *, held_link: bool = False,
                   failover_timeout_ms: int = FAILOVER_TIMEOUT_MS) -> Iterator[SentinelSetup]:
    """Run a master with `replicas` replicas and `sentinels` sentinels for the block; it
    starts once the replicas are in sync and every sentinel knows the others and the
    replicas. With `held_link`, the first replica reaches the master through a `HeldLink`
    (`setup.links[0]`); give it a long `failover_timeout_ms` then, or the sentinels point
    the replica at the master directly once that timeout has passed (`+fix-slave-config`)."""
    dirs: list[Path] = []
    started: list[RedisServer] = []
    try:
        master = _spawn(master_args, cluster=False, dirs=dirs)
        started.append(master)
        setup = SentinelSetup(master, [])
        for i in range(replicas):
            port = master.port
            if held_link and i == 0:
                setup.links.append(HeldLink(master.port))
                port = setup.links[0].port
            replica = _spawn(("--replicaof", HOST, str(port)), cluster=False, dirs=dirs)
            started.append(replica)
            setup.replicas.append(replica)
        for _ in range(sentinels):
            sentinel = _spawn_sentinel(master.port, dirs, failover_timeout_ms)
            started.append(sentinel)
            setup.sentinels.append(sentinel)
        deadline = time.monotonic() + READY_TIMEOUT
        while not _ready(setup):
            if time.monotonic() > deadline:
                raise RedisServerError(f"the sentinel setup was not ready in {READY_TIMEOUT}s")
            time.sleep(0.1)
        yield setup
    finally:
        for link in setup.links if started else ():
            link.cut()
        for server in started:
            with contextlib.suppress(Exception):
                if server.running:
                    server._proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
                server.stop()
        _remove_dirs(dirs)
