#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh machine: a virtualenv in the repo root
# (created if missing), the package with its test extras, then pytest on two workers.
# Extra arguments go to pytest, e.g. `scripts/test.sh -k sqlite`. Works from any directory.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="$venv/bin/python"

if [[ ! -x "$python" ]]; then
    echo "creating $venv" >&2
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$python" -m pip install --quiet --disable-pip-version-check -e "$root[test]"

cd "$root"
# The whole suite: a test that needs PostgreSQL or Redis fails, never skips, when it is down.
export LGCKPT_TEST_SERVERS="${LGCKPT_TEST_SERVERS:-required}"
"$python" -m ruff check .
"$python" -m mypy
exec "$python" -m pytest -n 2 -q -p no:cacheprovider "$@"
