#!/usr/bin/env bash
# Refresh requirements/test.txt: the exact version of everything the test environment installs
# (the package's dependencies, its [test] extra with ruff and mypy, and the build backend),
# resolved anew from PyPI for every Python from 3.10 on. Commit the result with any code that the
# new versions need (scripts/test-latest.sh shows that first). The package's own dependency
# ranges in pyproject.toml stay ranges: this pins the test environment only.
#
# The resolver is uv (Astral's pip-compatible resolver): one static binary from PyPI, a
# universal lock (markers for each Python) in pip's requirements format, so that installing from
# the lock needs nothing but pip. uv itself is pinned below and installed into .venv-tools.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.venv-tools"
uv_version="0.13.9"

if [[ ! -x "$tools/bin/uv" ]] || [[ "$("$tools/bin/uv" --version)" != "uv $uv_version"* ]]; then
    "${PYTHON:-python3}" -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$uv_version"
fi
cd "$root"
exec "$tools/bin/uv" pip compile --quiet --universal --python-version 3.10 \
    --custom-compile-command "bash scripts/lock.sh" \
    pyproject.toml requirements/tools.in --extra test -o requirements/test.txt "$@"
