"""Instructions counted, not timed: a command run under valgrind's callgrind, every thread of
its process (not the processes it starts, not the kernel). Counts move by about 1% from run
to run, whatever else the machine does: the benchmarks that compare small differences
(`bench_replicated_instructions.py`, `bench_floor.py --instructions`) take them by the
difference of two runs of different lengths, so that start-up and closing drop out."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

_COLLECTED = re.compile(r"Collected : (\d+)")


def require_valgrind() -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")


def instructions(argv: list[str], label: str) -> int:
    """Instructions `argv` executes under callgrind; SystemExit naming `label` if it fails."""
    with tempfile.TemporaryDirectory(prefix="lgxcg_") as d:
        log = Path(d) / "valgrind.log"
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={Path(d) / 'out'}",
               f"--log-file={log}", *argv]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        found = _COLLECTED.search(log.read_text()) if log.exists() else None
        if done.returncode != 0 or found is None:
            raise SystemExit(f"[{label}] failed under callgrind ({done.returncode}):\n"
                             f"{done.stdout[-2000:]}")
        return int(found.group(1))
