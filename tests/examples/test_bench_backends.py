"""benchmarks/bench_backends.py runs the SQLite backend at its smoke size with --json: the file
has the shape other tools read, the DeltaChannel savers are in it with positive figures, and
every restore check (ours against official, each DeltaChannel run against its plain twin) is OK."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_backends.py"
DELTA = ("official-memory-delta", "official-sqlite-delta", "ours-sqlite-delta")


def test_bench_backends_json_smoke(tmp_path: Path) -> None:
    path = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--backend", "sqlite", "--workloads", "1,2",
         "--threads", "2", "--long-turns", "15", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "MISMATCH" not in out and "official-sqlite-delta vs official-sqlite: OK" in out, out
    assert "== DeltaChannel" in out, out
    figures = json.loads(path.read_text())
    assert figures["benchmark"] == "backends" and "--json" in figures["command"]
    machine = figures["machine"]
    assert isinstance(machine["cpus"], int) and machine["python"] and machine["platform"]
    assert figures["versions"]["langgraph"]
    savers = figures["savers"]
    assert set(DELTA) <= set(savers) and "official-postgres-delta" not in savers
    for saver in savers:
        growth = figures["growth"][saver]
        assert len(growth["turns"]) == len(growth["bytes"]) == len(growth["turn_ms"]) == 15
        assert growth["turns"] == sorted(growth["turns"]) and growth["turns"][-1] == 15
        assert all(b > 0 for b in growth["bytes"]) and all(t > 0 for t in growth["turn_ms"])
        assert set(figures["throughput"][saver]) == {"1", "16"}
        assert all(v > 0 for v in figures["throughput"][saver].values())
        assert figures["restore_ms"][saver] > 0
