"""A loopback TCP forwarder whose one direction can be held: a replica's (or a standby's) link
to its primary, stopped on demand to open a replication lag as wide as a test wants."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

HOST = "127.0.0.1"


class HeldLink:
    """A TCP forwarder from a free loopback port (`port`) to `target` on 127.0.0.1.

    `hold()` stops passing the target's bytes on (they stay in this process, never reaching
    the client's socket; the client's bytes still flow to the target), `release()` lets them
    go, `cut()` drops what is held and closes every connection and the listener, for good.
    A `with` block cuts the link on exit.
    """

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server((HOST, 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._cut = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> HeldLink:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cut()

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        self._cut = True  # before waking the held pumps: they must drop, not send
        self._flowing.set()
        for sock in [self._listener, *self._socks]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._cut:
            try:
                down, _ = self._listener.accept()
                up = socket.create_connection((HOST, self.target), timeout=2)
                up.settimeout(None)
            except OSError:
                continue
            self._socks += [down, up]
            for src, dst, held in ((up, down, True), (down, up, False)):
                threading.Thread(target=self._pump, args=(src, dst, held), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, held: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if held:
                    self._flowing.wait()
                if self._cut:
                    return
                dst.sendall(data)
