"""benchmarks/bench_sealing.py runs at its smoke size on every backend, and its checks pass:
same restored state in every configuration, no tool output in the clear where encrypted, no
api_key from the config stored."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sealing.py"


def test_bench_sealing_smoke() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--backends", "memory,sqlite,postgres,redis"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "FAILED" not in out and "checks: OK" in out
    for backend in ("memory", "sqlite", "postgres", "redis"):
        section = out.split(f"[{backend}]", 1)[1].split("\n\n", 1)[0]
        rows = {line.split()[0]: line.split() for line in section.strip().splitlines()[1:]}
        assert set(rows) == {"plain", "compression", "encryption", "both"}, section
        assert rows["plain"][2] == "1.00" and rows["plain"][-1] == "-", section
        assert rows["encryption"][-1] == rows["both"][-1] == "OK", section
        assert re.fullmatch(r"\d+", rows["both"][1]), section  # checkpoints/s measured
