"""Fail unless the running environment is exactly what requirements/test.txt pins.

Run by scripts/test.sh after the locked install, with the virtualenv's Python. Every installed
distribution other than pip and this package must be pinned by the lock, at the pinned version.
A dependency added to pyproject.toml without refreshing the lock would have been installed at
whatever version was released today; this names it and says how to refresh.

With `--newer` (scripts/test-latest.sh) it only lists what differs from the lock.
"""

from __future__ import annotations

import sys
from importlib.metadata import distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

UNPINNED = {"pip", "langgraph-ckpt-ext"}


def pinned(lock: Path) -> dict[str, str]:
    """Name -> version of every line of the lock whose marker holds on this Python."""
    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if not line or line[0] in "# ":
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            (spec,) = req.specifier
            pins[canonicalize_name(req.name)] = spec.version
    return pins


def newer(pins: dict[str, str]) -> int:
    """Print each installed distribution whose version is not the lock's (`--newer`)."""
    for dist in sorted(distributions(), key=lambda d: canonicalize_name(d.metadata["Name"])):
        name = canonicalize_name(dist.metadata["Name"])
        if name not in UNPINNED and pins.get(name) != dist.version:
            print(f"{name}: {pins.get(name, 'not in the lock')} -> {dist.version}")
    return 0


def main(argv: list[str]) -> int:
    lock = Path(__file__).resolve().parent.parent / "requirements" / "test.txt"
    pins = pinned(lock)
    if argv == ["--newer"]:
        return newer(pins)
    wrong = []
    for dist in distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in UNPINNED:
            continue
        if name not in pins:
            wrong.append(f"{name} {dist.version} is installed but {lock.name} does not pin it")
        elif dist.version != pins[name]:
            wrong.append(f"{name} is {dist.version}, {lock.name} pins {pins[name]}")
    for line in sorted(wrong):
        print(f"check_lock: {line}", file=sys.stderr)
    if wrong:
        print("check_lock: refresh the lock with `bash scripts/lock.sh` (a new dependency), or "
              "remove what was installed by hand", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
