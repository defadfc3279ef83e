"""The test environment's lock (requirements/test.txt, made by scripts/lock.sh) covers what
pyproject.toml asks for, within its ranges, and scripts/check_lock.py reads it right."""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # (the lock brings tomli there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from check_lock import pinned  # noqa: E402

PINS = pinned(ROOT / "requirements" / "test.txt")


def _asked() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    return [Requirement(line) for line in lines]


def test_every_dependency_and_test_extra_is_pinned_within_its_range() -> None:
    for req in _asked():
        version = PINS.get(canonicalize_name(req.name))
        assert version is not None, f"{req.name} is not in the lock: run `bash scripts/lock.sh`"
        assert req.specifier.contains(version, prereleases=True), (
            f"the lock pins {req.name}=={version}, outside {req}: run `bash scripts/lock.sh`")
    assert "setuptools" in PINS and "mypy" in PINS and "ruff" in PINS  # the tools too

