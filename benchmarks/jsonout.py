"""What every benchmark's `--json` file starts with: the command, the machine, the versions."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("langgraph", "langgraph-checkpoint", "langgraph-ckpt-ext", "asyncpg", "redis",
            "aiosqlite")


def _relative(arg: str) -> str:
    """A path under the working directory as a relative one: no checkout's path in the file."""
    path = Path(arg)
    if path.is_absolute() and path.is_relative_to(Path.cwd()):
        return str(path.relative_to(Path.cwd()))
    return arg


def header(benchmark: str) -> dict[str, Any]:
    """`benchmark`, `command`, `machine` and `versions`: the keys every results file shares."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return {
        "benchmark": benchmark,
        "command": shlex.join(["python", *map(_relative, sys.argv)]),
        "machine": {"cpus": os.cpu_count() or 1, "python": platform.python_version(),
                    "platform": platform.platform()},
        "versions": versions,
    }


def write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")
