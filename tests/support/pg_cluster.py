"""Throwaway PostgreSQL clusters for tests: a primary and streaming standbys on loopback ports.

Each server is a data directory of its own, created by ``initdb`` (the primary) or
``pg_basebackup -R`` (a standby), in a temporary directory owned by the ``postgres`` user
(``initdb`` and ``postgres`` refuse root), started and stopped with ``pg_ctl``. Servers listen on
127.0.0.1 only, on free ports, with their unix sockets in that directory: the machine's own
server (port 5432) is never touched. ``pg_cluster`` stops every server it started
(``pg_ctl stop -m immediate``) and removes the directory, also when a test or startup fails.

Speed: ``initdb -N`` (no fsync of the fresh files) and small ``shared_buffers`` always; a
cluster made with ``fsync=False`` also runs with ``fsync=off``, fine for tests of routing and
reconnection but not for durability claims (``synchronous_commit=remote_apply`` tests keep it on).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.redis_servers import free_port

BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
HOST = "127.0.0.1"
USER = "postgres"
START_TIMEOUT = 30


_LIVE: set[PgNode] = set()
"""Servers started and not stopped yet: stopped at interpreter exit if a test left any."""


class PgClusterError(RuntimeError):
    """A server of the cluster could not be created, started or promoted."""


def _as_postgres(*args: str | Path, timeout: float = 60) -> str:
    cmd = ["runuser", "-u", USER, "--", *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise PgClusterError(f"{' '.join(map(str, args))} failed ({done.returncode}): "
                             f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


@dataclass(eq=False)
class PgNode:
    """One server: its data directory and port; `dsn` for clients."""

    name: str
    root: Path
    port: int
    running: bool = False

    @property
    def datadir(self) -> Path:
        return self.root / self.name

    @property
    def dsn(self) -> str:
        return f"postgresql://{USER}@{HOST}:{self.port}/postgres"

    def configure(self, **settings: str | int) -> None:
        """Append settings to postgresql.conf (the last one given wins); restart to apply
        those that need it, or `reload()`."""
        lines = "".join(f"{k} = '{v}'\n" for k, v in settings.items())
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write(lines)

    def start(self) -> None:
        _as_postgres(BIN / "pg_ctl", "start", "-w", "-t", str(START_TIMEOUT), "-D",
                     self.datadir, "-l", self.root / f"{self.name}.log")
        self.running = True
        _LIVE.add(self)

    def stop(self, mode: str = "immediate") -> None:
        """`pg_ctl stop -m mode`: `immediate` is a crash (no shutdown checkpoint, clients cut)."""
        if self.running:
            _as_postgres(BIN / "pg_ctl", "stop", "-w", "-m", mode, "-D", self.datadir)
            self.running = False
            _LIVE.discard(self)

    def reload(self) -> None:
        _as_postgres(BIN / "pg_ctl", "reload", "-D", self.datadir)

    def promote(self) -> None:
        """A standby becomes a primary (waits until it accepts writes)."""
        _as_postgres(BIN / "pg_ctl", "promote", "-w", "-t", str(START_TIMEOUT), "-D",
                     self.datadir)

    def psql(self, query: str) -> str:
        """One query's result, unaligned, through the unix socket of this server."""
        return _as_postgres(BIN / "psql", "-X", "-A", "-t", "-h", self.root, "-p",
                            str(self.port), "-d", "postgres", "-c", query).strip()

    def log(self) -> str:
        path = self.root / f"{self.name}.log"
        return path.read_text() if path.exists() else ""


@dataclass
class PgCluster:
    """A primary and its standbys, in `root`."""

    root: Path
    fsync: bool
    primary: PgNode = field(init=False)
    standbys: list[PgNode] = field(default_factory=list)

    def nodes(self) -> list[PgNode]:
        return [self.primary, *self.standbys]

    def start_primary(self, **settings: str | int) -> PgNode:
        node = PgNode("primary", self.root, free_port())
        _as_postgres(BIN / "initdb", "-N", "-A", "trust", "-U", USER, "-D", node.datadir)
        node.configure(
            listen_addresses=HOST, port=node.port, unix_socket_directories=str(self.root),
            shared_buffers="16MB", wal_level="replica", max_wal_senders=8, hot_standby="on",
            fsync="on" if self.fsync else "off", **settings)
        self.primary = node
        node.start()
        return node

    def start_standby(self, name: str = "standby", *, upstream_port: int | None = None,
                      **settings: str | int) -> PgNode:
        """`pg_basebackup -R` of the primary (its `primary_conninfo` and `standby.signal`
        written), started; it streams the primary's WAL, from `upstream_port` if given (a
        `tests.support.tcp_link.HeldLink` to the primary's port). Its `cluster_name` is
        `name`, the application name `synchronous_standby_names` matches."""
        node = PgNode(name, self.root, free_port())
        _as_postgres(BIN / "pg_basebackup", "-h", HOST, "-p", str(self.primary.port), "-U",
                     USER, "-D", node.datadir, "-R", "--checkpoint=fast", "-X", "stream")
        node.configure(port=node.port, cluster_name=name, **settings)
        if upstream_port is not None:
            # -R wrote primary_conninfo to postgresql.auto.conf, read after postgresql.conf.
            auto = node.datadir / "postgresql.auto.conf"
            auto.write_text(auto.read_text().replace(
                f"port={self.primary.port} ", f"port={upstream_port} "))
            if f"port={upstream_port} " not in auto.read_text():
                raise PgClusterError(f"no primary port in {auto}:\n{auto.read_text()}")
        self.standbys.append(node)
        node.start()
        return node

    def wait_streaming(self, count: int = 1) -> None:
        """Until `count` standbys stream from the primary (`pg_stat_replication`)."""
        deadline = time.monotonic() + START_TIMEOUT
        while int(self.primary.psql(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")) < count:
            if time.monotonic() > deadline:
                raise PgClusterError("the standby does not stream:\n" + self.standbys[-1].log())
            time.sleep(0.05)

    def wait_replayed(self, standby: PgNode) -> None:
        """Until `standby` has replayed all the WAL the primary had flushed when called."""
        lsn = self.primary.psql("SELECT pg_current_wal_flush_lsn()")
        deadline = time.monotonic() + START_TIMEOUT
        while standby.psql(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn") != "t":
            if time.monotonic() > deadline:
                raise PgClusterError(f"{standby.name} did not replay up to {lsn}")
            time.sleep(0.01)

    def close(self) -> None:
        for node in reversed(self.nodes() if hasattr(self, "primary") else self.standbys):
            with contextlib.suppress(Exception):
                node.stop()


@contextlib.contextmanager
def pg_cluster(*, fsync: bool = True) -> Iterator[PgCluster]:
    """A cluster of no server yet, in a fresh directory: `start_primary`, `start_standby`.
    Every server started is stopped, and the directory removed, on exit."""
    if not (BIN / "initdb").exists():
        raise PgClusterError(f"no PostgreSQL binaries in {BIN} (set PG_BIN)")
    root = Path(tempfile.mkdtemp(prefix="lgckpt-pg-"))
    pw = pwd.getpwnam(USER)
    os.chown(root, pw.pw_uid, pw.pw_gid)
    cluster = PgCluster(root, fsync)
    try:
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


@atexit.register
def _stop_left_over() -> None:
    for node in list(_LIVE):
        with contextlib.suppress(Exception):
            node.stop()
