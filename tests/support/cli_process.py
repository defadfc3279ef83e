"""`lgckpt` in a process of its own, without paying for the imports at every run.

A fresh `python -m langgraph_ckpt_ext` spends about a second importing LangGraph, LangChain
and the drivers before it does anything; the CLI tests run it hundreds of times. Each pytest
process starts one helper process that imports the command line once, then forks a child per
run: the child is a new process (its own stores, connections, caches and event loops, none
opened before the fork), with the run's arguments, environment, working directory, stdin and
stdout/stderr files, and it exits through the interpreter's normal shutdown (atexit hooks,
non-daemon threads joined), as `python -m langgraph_ckpt_ext` does. The tests that must see
the real entry points (the console script, `python -m`, a process killed halfway) start them
as plain subprocesses.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

RUN_TIMEOUT = 120.0  # seconds, as the tests' subprocess.run had

# The helper: reads one JSON request a line on stdin, answers one JSON line on stdout.
_HELPER = r"""
import gc, importlib, json, os, pkgutil, signal, sys, time, traceback
import langgraph_ckpt_ext
import langgraph_ckpt_ext.cli as cli
# Every module of the package, also those the commands import when they run (a child would
# import them again at each run); those of an extra that is not installed are left out.
for mod in pkgutil.walk_packages(langgraph_ckpt_ext.__path__, "langgraph_ckpt_ext."):
    if not mod.name.endswith("__main__"):
        try:
            importlib.import_module(mod.name)
        except ImportError:
            pass
# What is imported now is never garbage: a child's shutdown then leaves it alone instead of
# walking (and so copying, page by page) the whole inherited heap: 0.1 s a run, not 0.5 s.
gc.freeze()

answers = os.fdopen(os.dup(1), "w")
requests = sys.stdin
for line in requests:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.setsid()  # its own group: a timeout ends whatever it started too
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path, mode in ((0, req["stdin"], os.O_RDONLY), (1, req["out"], os.O_WRONLY),
                               (2, req["err"], os.O_WRONLY)):
            target = os.open(path, mode)
            os.dup2(target, fd)
            os.close(target)
        answers.close()
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)
        sys.argv = [sys.argv[0], *req["argv"]]
        try:
            code = cli.main(req["argv"])
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.exit(code)  # the interpreter's own shutdown, not os._exit
    deadline = time.monotonic() + req["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            code = "timeout"
            break
        time.sleep(0.002)
    answers.write(json.dumps({"code": code}) + "\n")
    answers.flush()
"""


class _Helper:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd=Path(__file__).resolve().parents[2])

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, stdin: str | None,
            timeout: float) -> tuple[int, str, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with tempfile.TemporaryDirectory(prefix="lgckpt_run_") as tmp:
            files = {name: Path(tmp) / name for name in ("in", "out", "err")}
            files["in"].write_text(stdin or "")
            files["out"].touch()
            files["err"].touch()
            self.proc.stdin.write(json.dumps({
                "argv": argv, "env": env, "cwd": str(cwd), "timeout": timeout,
                "stdin": str(files["in"]), "out": str(files["out"]),
                "err": str(files["err"])}) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
            if not answer:
                raise RuntimeError(f"the lgckpt helper process ended ({self.proc.poll()})")
            code = json.loads(answer)["code"]
            out, err = files["out"].read_text(), files["err"].read_text()
        if code == "timeout":
            raise subprocess.TimeoutExpired(["lgckpt", *argv], timeout, out, err)
        return int(code), out, err

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_idle: list[_Helper] = []  # one helper per run at a time; a second run at once starts another
_lock = threading.Lock()


def run_lgckpt(argv: list[str], *, env: dict[str, str], cwd: Path, stdin: str | None = None,
               timeout: float = RUN_TIMEOUT) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `lgckpt ARGV` run in a new process (see the module)."""
    with _lock:
        helper = _idle.pop() if _idle else None
    if helper is None or helper.proc.poll() is not None:
        helper = _Helper()
        atexit.register(helper.close)
    try:
        return helper.run(argv, env, cwd, stdin, timeout)
    finally:
        with _lock:
            _idle.append(helper)
