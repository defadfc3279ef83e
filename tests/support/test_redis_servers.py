"""The throwaway Redis harness itself: servers start, stop, come back, and leave nothing behind."""

from __future__ import annotations

import os
import socket
import time

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncClusterClient
from redis.cluster import RedisCluster as ClusterClient

from tests.support.redis_servers import (
    MAX_CLUSTER_PORT,
    RedisServer,
    RedisServerError,
    free_port,
    port_is_free,
    redis_cluster,
    redis_server,
)

pytestmark = pytest.mark.redis


def process_gone(pid: int | None) -> bool:
    """Whether no process with this pid exists (our children are reaped, so no zombie either)."""
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_left_nothing(servers: list[RedisServer]) -> None:
    for server in servers:
        assert not server.running
        assert process_gone(server.pid), f"{server!r} still has a process"
        assert port_is_free(server.port, reuse_addr=True), f"port {server.port} still in use"
        assert not server.dir.exists(), f"{server.dir} was not removed"


def test_free_port() -> None:
    port = free_port()
    assert 0 < port <= 65535
    assert port_is_free(port)
    cluster_port = free_port(cluster=True)
    assert cluster_port <= MAX_CLUSTER_PORT
    assert port_is_free(cluster_port) and port_is_free(cluster_port + 10000)


def test_standalone_server_stop_and_start() -> None:
    with redis_server() as server:
        assert server.host == "127.0.0.1"
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url, socket_connect_timeout=1, socket_timeout=2)
        try:
            assert client.set("k", "v")
            assert client.get("k") == b"v"
            assert client.config_get("save") == {"save": ""}
            assert client.info("server")["tcp_port"] == server.port

            first_pid = server.pid
            server.stop()
            assert not server.running
            assert process_gone(first_pid)
            with pytest.raises(redis.ConnectionError):
                client.ping()

            server.start()
            assert server.running and server.pid != first_pid
            assert client.ping()
            assert client.get("k") is None  # persistence is off: a restart starts empty
            assert client.set("k", "again") and client.get("k") == b"again"
        finally:
            client.close()
    assert_left_nothing([server])


def test_extra_args_are_passed() -> None:
    with redis_server("--maxmemory", "10mb") as server, server.client() as client:
        assert client.config_get("maxmemory") == {"maxmemory": str(10 * 1024 * 1024)}
    assert_left_nothing([server])


def test_cluster() -> None:
    started = time.monotonic()
    with redis_cluster() as cluster:
        elapsed = time.monotonic() - started
        assert elapsed < 15, f"cluster took {elapsed:.1f}s to start"
        assert len(cluster.nodes) == 3
        assert all(host == "127.0.0.1" for host, _ in cluster.nodes)
        assert all(port <= MAX_CLUSTER_PORT for _, port in cluster.nodes)
        port = cluster.nodes[0][1]
        assert cluster.url == f"redis://127.0.0.1:{port}"

        client = ClusterClient(host="127.0.0.1", port=port)
        try:
            keys = {"{a}x": "1", "{b}y": "2", "{c}z": "3"}
            slots = {client.keyslot(key) for key in keys}
            assert len(slots) == 3
            owners = {client.get_node_from_key(key).port for key in keys}
            assert len(owners) > 1, "the keys should land on different nodes"
            for key, value in keys.items():
                assert client.set(key, value)
            for key, value in keys.items():
                assert client.get(key) == value.encode()
        finally:
            client.close()

        by_startup_nodes = ClusterClient(startup_nodes=cluster.startup_nodes)
        try:
            assert by_startup_nodes.get("{a}x") == b"1"
        finally:
            by_startup_nodes.close()

        for server in cluster.servers:
            with server.client() as node:
                info = node.cluster("INFO")  # redis-py parses it into a dict of str
            assert info["cluster_state"] == "ok"
            assert info["cluster_known_nodes"] == "3"
            assert info["cluster_slots_assigned"] == "16384"
    assert_left_nothing(cluster.servers)


async def test_cluster_async_client() -> None:
    with redis_cluster() as cluster:
        client = AsyncClusterClient.from_url(cluster.url)
        try:
            assert await client.set("{async}key", "value")
            assert await client.get("{async}key") == b"value"
        finally:
            await client.aclose()
    assert_left_nothing(cluster.servers)


def test_port_taken_before_bind_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Losing the race for a port (another worker took it) costs a retry, not a failure."""
    from . import redis_servers

    real_free_port = redis_servers.free_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        handed_out: list[int] = []

        def racy_free_port(*, cluster: bool = False) -> int:
            port = taken if not handed_out else real_free_port(cluster=cluster)
            handed_out.append(port)
            return port

        monkeypatch.setattr(redis_servers, "free_port", racy_free_port)
        with redis_server() as server, server.client() as client:
            assert client.ping()
            assert handed_out[0] == taken and server.port != taken
            assert len(handed_out) == 2
            # Both attempts share the server's directory, so its log tells the story.
            assert "Address already in use" in server.log_path.read_text()
    assert_left_nothing([server])


def test_startup_failure_reports_log_and_cleans_up() -> None:
    with (
        pytest.raises(RedisServerError, match="exited with code") as raised,
        redis_server("--no-such-opt", "1"),
    ):
        pass
    assert "no-such-opt" in str(raised.value)  # the log tail says what redis-server disliked


def test_missing_redis_server_is_an_error_not_a_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    from . import redis_servers

    monkeypatch.setattr(redis_servers.shutil, "which", lambda name: None)
    with pytest.raises(RedisServerError, match="'redis-server' was not found on PATH"), redis_server():
        pass


def test_cluster_creation_failure_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """If ``redis-cli --cluster create`` fails, the nodes already started are stopped and removed."""
    from . import redis_servers

    real_which = redis_servers.shutil.which
    started: list[RedisServer] = []
    real_start = RedisServer.start

    def recording_start(self: RedisServer, *args: float) -> None:
        real_start(self, *args)
        started.append(self)

    def which(name: str) -> str | None:
        return "/bin/false" if name == "redis-cli" else real_which(name)

    monkeypatch.setattr(redis_servers.shutil, "which", which)
    monkeypatch.setattr(RedisServer, "start", recording_start)
    with pytest.raises(RedisServerError, match="cluster create failed"), redis_cluster():
        pass
    assert len(started) == 3
    assert_left_nothing(started)
