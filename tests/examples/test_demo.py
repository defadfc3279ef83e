"""scripts/demo.py runs end to end: pause, resume by a second process, history, fork."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo.py"


def test_demo(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = subprocess.run(
        [sys.executable, str(DEMO), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout

    assert f"database: {db}" in out
    assert "awaiting approval of {'action'" in out
    starter = re.search(r"Process (\d+) starts thread", out)
    resumer = re.search(r"process (\d+) opened .*, resumed '[\w-]+' with 'approve'", out)
    assert starter and resumer and starter[1] != resumer[1], out
    assert "history of" in out and "step  1  loop    next=act" in out
    assert "step  2  update  next=act" in out  # the fork's branch point
    assert re.search(r"ticket-\w+ +status=approved +Final answer: the disk has room again\.", out)
    assert re.search(r"ticket-\w+-fork +status=rejected +Final answer: nothing deleted", out)
    assert db.exists()
