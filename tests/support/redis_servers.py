"""Throwaway Redis servers for tests: a standalone server or a small cluster, on loopback only.

Every server is a ``redis-server`` subprocess this module started itself (``--daemonize no``), in a
temporary directory of its own, with persistence off. Context managers stop the processes they
started (SIGTERM, then SIGKILL after a timeout) and remove the directories, even when startup fails
halfway. Nothing here ever signals a process it did not start.

Ports come from the kernel (bind to port 0). Another process can take such a port before
``redis-server`` binds it (for instance a second pytest-xdist worker), so a server that fails with
"Address already in use" is retried on a fresh port, and a server is only accepted as ready when
the process answering PING reports this harness's own child pid.

If ``redis-server`` (or ``redis-cli`` for clusters) is not on PATH, :class:`RedisServerError` is
raised: tests that need Redis fail loudly instead of being skipped.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.retry import Retry

__all__ = [
    "HOST",
    "PortInUseError",
    "RedisCluster",
    "RedisServer",
    "RedisServerError",
    "free_port",
    "port_is_free",
    "redis_cluster",
    "redis_server",
]

HOST = "127.0.0.1"
"""Every server listens on this address only."""

CLUSTER_BUS_OFFSET = 10000
"""A cluster node also listens on ``port + CLUSTER_BUS_OFFSET`` (the cluster bus)."""

MAX_CLUSTER_PORT = 65535 - CLUSTER_BUS_OFFSET
"""Highest client port a cluster node can use: its bus port must still be a valid port."""

START_TIMEOUT = 10.0
"""Seconds a server gets to answer PING after it was spawned."""

STOP_TIMEOUT = 10.0
"""Seconds a server gets to exit after SIGTERM before it is sent SIGKILL."""

CLUSTER_TIMEOUT = 30.0
"""Seconds a new cluster gets to reach ``cluster_state:ok`` on every node."""

PORT_ATTEMPTS = 10
"""How many fresh ports a server is tried on before giving up."""

CLUSTER_SLOTS = 16384

_LIVE: set[subprocess.Popen[bytes]] = set()
"""Processes this module started and has not yet reaped; killed at interpreter exit if left over."""


class RedisServerError(RuntimeError):
    """A Redis server or cluster could not be started (or redis-server is not installed)."""


class PortInUseError(RedisServerError):
    """redis-server exited because its port (or its cluster bus port) was already taken."""


def _executable(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RedisServerError(
            f"{name!r} was not found on PATH; these tests need a real Redis "
            "(for example `apt-get install redis-server` or `brew install redis`)"
        )
    return path


def port_is_free(port: int, *, reuse_addr: bool = False) -> bool:
    """Whether a TCP socket can bind to ``127.0.0.1:port`` right now.

    With ``reuse_addr=True`` the check sets ``SO_REUSEADDR`` like redis-server does, so sockets in
    TIME_WAIT left by a server that just exited do not count: use that to ask "could a new server
    listen here?". Without it the check is stricter, which is what port selection wants.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse_addr:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(*, cluster: bool = False) -> int:
    """A TCP port on 127.0.0.1 that is free right now (bind to port 0, read it, close).

    With ``cluster=True`` the port is at most :data:`MAX_CLUSTER_PORT` and its cluster bus port
    (``port + 10000``) is free as well. The port is not reserved: callers must cope with losing a
    race for it (:func:`redis_server` and :func:`redis_cluster` retry on a fresh port).
    """
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if not cluster:
            return port
        if port <= MAX_CLUSTER_PORT and port_is_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise RedisServerError("could not find a free port (and free cluster bus port) on 127.0.0.1")


def _stop_process(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM one process we started, wait, SIGKILL it if it does not exit in time, reap it."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
    finally:
        if proc.returncode is not None:
            _LIVE.discard(proc)


@atexit.register
def _kill_leftovers() -> None:
    """Last resort for servers whose context manager never ran its exit (e.g. a leaked generator)."""
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            _stop_process(proc, timeout=2.0)


def _info_value(info: Any, key: str) -> str | None:
    """One field of an INFO / CLUSTER INFO reply, whether redis-py parsed it or not."""
    if isinstance(info, dict):
        value = info.get(key)
        if value is None:
            value = info.get(key.encode())
        if isinstance(value, bytes):
            value = value.decode()
        return None if value is None else str(value)
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


class RedisServer:
    """One ``redis-server`` process owned by this harness, listening on ``127.0.0.1:port``.

    :meth:`stop` and :meth:`start` take the server away and bring it back on the same port and with
    the same directory (so a cluster node keeps its ``nodes.conf``). Use it from a single thread.
    """

    def __init__(self, port: int, directory: Path, args: Sequence[str] = ()) -> None:
        self.host: str = HOST
        self.port: int = port
        self.dir: Path = directory
        self.args: tuple[str, ...] = tuple(args)
        self.log_path: Path = directory / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where the current process's part of the log begins

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<RedisServer {self.host}:{self.port} {state}>"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The pid of the current process, or None if it was never started."""
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the current process has been started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The argv this server is started with."""
        return [
            _executable("redis-server"),
            "--bind", HOST,
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--daemonize", "no",
            *self.args,
        ]  # fmt: skip

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new sync client for this server (the caller closes it).

        Unless ``kwargs`` say otherwise it does not retry: redis-py 8 retries a failed command
        10 times with backoff by default, so a ping to a stopped server would take seconds to fail.
        """
        kwargs.setdefault("socket_connect_timeout", 2.0)
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        return redis.Redis(host=self.host, port=self.port, **kwargs)

    def log_tail(self, lines: int = 20, *, current_only: bool = False) -> str:
        """The last lines of the server's log (stdout and stderr of every start, appended).

        With ``current_only=True`` only what the current (or last) process wrote.
        """
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_start if current_only else 0)
                text = log.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server (again) on its port and wait until it answers PING.

        Raises :class:`PortInUseError` if the port is taken, :class:`RedisServerError` if the
        server exits or does not answer within ``timeout`` seconds. Either way no process is left.
        """
        if self.running:
            raise RedisServerError(f"{self!r} is already running")
        with self.log_path.open("ab") as log:
            self._log_start = log.tell()
            log.write(f"--- harness: starting {' '.join(self.command())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        _LIVE.add(self._proc)
        try:
            self._wait_ready(self._proc, timeout)
        except BaseException:
            _stop_process(self._proc)
            raise

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``); no-op if it is not running."""
        if self._proc is not None:
            _stop_process(self._proc, timeout)

    def _wait_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = "none"
        delay = 0.01
        while True:
            # Checked after every probe: a probe can take a while (e.g. if a listener that is not
            # Redis holds the port and never answers), and by then our server has usually exited.
            code = proc.poll()
            if code is not None:
                tail = self.log_tail(current_only=True)
                error = PortInUseError if "Address already in use" in tail else RedisServerError
                raise error(
                    f"redis-server on port {self.port} exited with code {code} before it was ready; "
                    f"log tail ({self.log_path}):\n{tail}"
                )
            try:
                with self.client(socket_connect_timeout=0.25, socket_timeout=0.5) as client:
                    client.ping()
                    served_by = _info_value(client.info("server"), "process_id")
                if served_by == str(proc.pid):
                    return
                # Someone else's server answered on our port; ours will fail to bind and exit.
                last_error = f"port {self.port} is served by pid {served_by}"
            except redis.RedisError as exc:
                # str(), not repr(): redis-py 8 reprs errors as e.g. "network:ConnectionError".
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                if proc.poll() is not None:
                    continue  # it exited while we probed: report that (and its log) instead
                raise RedisServerError(
                    f"redis-server on port {self.port} (pid {proc.pid}) did not answer PING within "
                    f"{timeout:.0f}s (last error: {last_error}); log tail ({self.log_path}):\n"
                    f"{self.log_tail(current_only=True)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _spawn(args: Sequence[str], *, cluster: bool, dirs: list[Path]) -> RedisServer:
    """Start one server on a fresh port, retrying on new ports when it loses a race for one.

    The directory is appended to ``dirs`` as soon as it exists so the caller can always remove it.
    """
    _executable("redis-server")
    directory = Path(tempfile.mkdtemp(prefix="redis-test-"))
    dirs.append(directory)
    return start_on_free_port(lambda: RedisServer(free_port(cluster=cluster), directory, args))


S = TypeVar("S", bound="RedisServer")


def start_on_free_port(make: Callable[[], S]) -> S:
    """Start the server `make()` builds (on a port it picks), again with a new one while it
    loses a race for its port."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        server = make()
        try:
            server.start()
        except PortInUseError:
            if attempt == PORT_ATTEMPTS:
                raise
            continue
        return server
    raise AssertionError("unreachable")


def _remove_dirs(dirs: Sequence[Path]) -> None:
    for directory in dirs:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def redis_server(*args: str) -> Iterator[RedisServer]:
    """Run a standalone ``redis-server`` on a free loopback port for the duration of the block.

    ``args`` are extra command-line options (``"--maxmemory", "10mb"``); do not pass ``--port`` or
    ``--bind``. The server runs without persistence in a temporary directory that is removed on
    exit, after the process has been stopped.
    """
    dirs: list[Path] = []
    server: RedisServer | None = None
    try:
        server = _spawn(args, cluster=False, dirs=dirs)
        yield server
    finally:
        if server is not None:
            server.stop()
        _remove_dirs(dirs)


@dataclass
class RedisCluster:
    """A running Redis cluster of masters only, every node on 127.0.0.1."""

    servers: list[RedisServer] = field(default_factory=list)
    """One :class:`RedisServer` per node; each can be stopped and started on its own."""

    @property
    def nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node."""
        return [(server.host, server.port) for server in self.servers]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:P1``, the first node: enough for cluster clients to find the rest."""
        first = self.servers[0]
        return f"redis://{first.host}:{first.port}"

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """New :class:`redis.cluster.ClusterNode` objects for ``RedisCluster(startup_nodes=...)``.

        A fresh list on every access: redis-py attaches connections to these objects, so two
        clients should not share them. For ``redis.asyncio.cluster`` build its own ``ClusterNode``
        from :attr:`nodes`.
        """
        return [ClusterNode(host, port) for host, port in self.nodes]


def _cluster_ready(servers: Sequence[RedisServer]) -> tuple[bool, str]:
    """Whether every node sees a healthy cluster of exactly these nodes with all slots served."""
    states: list[str] = []
    ready = True
    for server in servers:
        try:
            with server.client(socket_connect_timeout=0.5, socket_timeout=1.0) as client:
                info = client.execute_command("CLUSTER INFO")
        except redis.RedisError as exc:
            states.append(f"{server.port}: {exc!r}")
            ready = False
            continue
        state = _info_value(info, "cluster_state")
        assigned = _info_value(info, "cluster_slots_assigned")
        slots_ok = _info_value(info, "cluster_slots_ok")
        known = _info_value(info, "cluster_known_nodes")
        states.append(
            f"{server.port}: state={state} assigned={assigned} ok={slots_ok} known_nodes={known}"
        )
        expected = ("ok", str(CLUSTER_SLOTS), str(CLUSTER_SLOTS), str(len(servers)))
        if (state, assigned, slots_ok, known) != expected:
            ready = False
    return ready, "\n".join(states)


@contextlib.contextmanager
def redis_cluster(masters: int = 3) -> Iterator[RedisCluster]:
    """Run a Redis cluster of ``masters`` masters (no replicas) for the duration of the block.

    Nodes start on free loopback ports whose cluster bus ports (``port + 10000``) are free too,
    are joined with ``redis-cli --cluster create``, and the block runs once every node reports
    ``cluster_state:ok`` with all 16384 slots assigned. On exit, or if startup fails at any
    point, every node started so far is stopped and every directory removed.
    """
    if masters < 3:
        raise ValueError("redis-cli --cluster create needs at least 3 masters")
    redis_cli = _executable("redis-cli")
    _executable("redis-server")
    dirs: list[Path] = []
    cluster = RedisCluster()
    node_args = (
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", "5000",
    )  # fmt: skip
    try:
        for _ in range(masters):
            cluster.servers.append(_spawn(node_args, cluster=True, dirs=dirs))
        addresses = [f"{host}:{port}" for host, port in cluster.nodes]
        create = subprocess.run(
            [redis_cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=CLUSTER_TIMEOUT,
            check=False,
        )
        output = create.stdout.decode(errors="replace")
        if create.returncode != 0:
            raise RedisServerError(
                f"redis-cli --cluster create failed with code {create.returncode}:\n{output}"
            )
        deadline = time.monotonic() + CLUSTER_TIMEOUT
        while True:
            ready, states = _cluster_ready(cluster.servers)
            if ready:
                break
            if time.monotonic() >= deadline:
                raise RedisServerError(
                    f"cluster did not become ready within {CLUSTER_TIMEOUT:.0f}s:\n{states}\n"
                    f"redis-cli output:\n{output}"
                )
            time.sleep(0.05)
        yield cluster
    finally:
        for server in cluster.servers:
            with contextlib.suppress(Exception):
                server.stop()
        _remove_dirs(dirs)
