"""`python -m MODULE ARGS` for the tests, started in milliseconds instead of seconds.

A fresh interpreter spends one to three seconds importing LangGraph, LangChain and the
drivers before it does anything, and the tests start such processes hundreds of times (the
command line, the sweep, smart and migration workers). `start(module, args)` gives a process
that runs `python -m MODULE ARGS` the same way: a new process with a pid of its own (SIGKILL
and SIGSTOP reach it), its own environment and working directory, stdin, stdout and stderr as
pipes, an exit status as `subprocess` reports it (-9: killed), and the interpreter's normal
shutdown (atexit hooks, non-daemon threads joined). It is forked from a helper process, one
per test process, that imported the package and the tests' support modules once and opened
nothing (`tests.support.preload`). `Forked` answers the part of
`subprocess.Popen` the tests use. The tests that must see the real entry points (the console
script, a new interpreter) start plain subprocesses.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]

# The helper: requests (one JSON line each) on stdin, answers on stdout: {"id", "pid"} once a
# child is forked, {"ended": pid, "code"} once it has ended.
_HELPER = r"""
import json, os, runpy, select, signal, sys
import tests.support.preload

answers = os.fdopen(os.dup(1), "w")
children, pending = set(), b""


def answer(**msg):
    answers.write(json.dumps(msg) + "\n")
    answers.flush()


while True:
    ready, _, _ = select.select([0], [], [], 0.005 if children else None)
    if ready:
        data = os.read(0, 65536)
        if not data:  # the test process is gone: so are its children
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            for pid in children:
                os.waitpid(pid, 0)
            break
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                answers.close()
                # The same order as the test's side opens the other ends: no deadlock.
                for fd, path, mode in zip((0, 1, 2), req["fifos"],
                                          (os.O_RDONLY, os.O_WRONLY, os.O_WRONLY)):
                    target = os.open(path, mode)
                    os.dup2(target, fd)
                    os.close(target)
                os.chdir(req["cwd"])
                os.environ.clear()
                os.environ.update(req["env"])
                sys.stdin = open(0, "r", closefd=False)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)
                sys.argv = [req["module"], *req["args"]]
                sys.modules.pop(req["module"], None)  # run afresh as __main__, as -m does
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
                sys.exit(0)  # or what it raised: the interpreter's own shutdown either way
            children.add(pid)
            answer(id=req["id"], pid=pid)
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        children.discard(pid)
        answer(ended=pid, code=os.waitstatus_to_exitcode(status))
"""


class _Helper:
    """The helper process of this test process, and what it said about its children."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            cwd=ROOT)
        self.changed = threading.Condition()
        self.pids: dict[int, int] = {}  # request id -> pid
        self.codes: dict[int, int] = {}  # pid -> exit code
        self.next_id = 0
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.changed:
                if "ended" in msg:
                    self.codes[msg["ended"]] = msg["code"]
                else:
                    # A pid is used again once its process is reaped: an exit code still held
                    # for it is that of an earlier child (its "ended" came before this fork).
                    self.codes.pop(msg["pid"], None)
                    self.pids[msg["id"]] = msg["pid"]
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def fork(self, request: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        with self.changed:
            request_id = self.next_id = self.next_id + 1
            self.proc.stdin.write((json.dumps({**request, "id": request_id}) + "\n").encode())
            self.proc.stdin.flush()
            if not self.changed.wait_for(
                    lambda: request_id in self.pids or self.proc.poll() is not None, 60):
                raise RuntimeError("the process helper did not answer")
            if request_id not in self.pids:
                raise RuntimeError(f"the process helper ended ({self.proc.poll()})")
            return self.pids.pop(request_id)

    def code(self, pid: int, timeout: float | None) -> int | None:
        """The exit code of child `pid`, once it has ended (taken: asked once)."""
        with self.changed:
            self.changed.wait_for(lambda: pid in self.codes, timeout)
            return self.codes.pop(pid, None)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_helper: _Helper | None = None
_lock = threading.Lock()


def _the_helper() -> _Helper:
    global _helper
    with _lock:
        if _helper is None or _helper.proc.poll() is not None:
            _helper = _Helper()
            atexit.register(_helper.close)
        return _helper


class Forked:
    """A process `start` made: `stdin`, `stdout`, `stderr` (text), `pid`, `returncode`, and
    `poll`, `wait`, `communicate`, `send_signal`, `kill` as `subprocess.Popen` has them."""

    def __init__(self, module: str, args: list[str], cwd: Path | str, env: dict[str, str]
                 ) -> None:
        self.args = [module, *args]
        self.returncode: int | None = None
        self._helper = _the_helper()
        with tempfile.TemporaryDirectory(prefix="lgx_forked_") as tmp:
            fifos = [os.path.join(tmp, name) for name in ("in", "out", "err")]
            for path in fifos:
                os.mkfifo(path)
            self.pid = self._helper.fork({"module": module, "args": args, "cwd": str(cwd),
                                          "env": env, "fifos": fifos})
            self.stdin: IO[str] = open(fifos[0], "w")  # noqa: SIM115 - closed by communicate
            self.stdout: IO[str] = open(fifos[1])  # noqa: SIM115
            self.stderr: IO[str] = open(fifos[2], errors="backslashreplace")  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._helper.code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._helper.code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: str | None = None, timeout: float | None = None
                    ) -> tuple[str, str]:
        """Write `input`, close stdin, read stdout and stderr to their end and wait."""
        if not self.stdin.closed:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:  # it ended, or closed its stdin: as Popen, go on
                pass
        got: dict[str, str] = {}

        def drain(name: str, stream: IO[str]) -> None:
            got[name] = stream.read()
            stream.close()

        readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
                   for n, s in (("out", self.stdout), ("err", self.stderr))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(timeout)
        return got["out"], got["err"]

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.poll() is None:
            self.kill()
        for stream in (self.stdin, self.stdout, self.stderr):
            if not stream.closed:
                stream.close()
        self.wait()


def start(module: str, *args: str, cwd: Path | str = ROOT,
          env: dict[str, str] | None = None) -> Forked:
    """`python -m MODULE ARGS` in a new process forked from the helper (see the module)."""
    return Forked(module, list(args), cwd, dict(os.environ) if env is None else env)


RUN_TIMEOUT = 120.0  # seconds, as the tests' subprocess.run had


def run_lgckpt(argv: list[str], *, env: dict[str, str], cwd: Path, stdin: str | None = None,
               timeout: float = RUN_TIMEOUT) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `lgckpt ARGV` (`python -m langgraph_ckpt_ext`), run to
    its end in a process of its own; killed, and TimeoutExpired, after `timeout` seconds."""
    with start("langgraph_ckpt_ext", *argv, cwd=cwd, env=env) as proc:  # exit: killed if alive
        out, err = proc.communicate(stdin, timeout)
        return proc.wait(), out, err
