#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh machine: a virtualenv in the repo root
# (created if missing), the package with its test extras at the versions requirements/test.txt
# pins, then ruff, mypy and pytest on two workers. Extra arguments go to pytest, e.g.
# `scripts/test.sh -k sqlite`. Works from any directory. scripts/test-latest.sh runs the same
# against the newest releases instead of the lock.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"

make_venv
locked_install "[test]"

cd "$root"
# The whole suite: a test that needs PostgreSQL or Redis fails, never skips, when it is down.
export LGCKPT_TEST_SERVERS="${LGCKPT_TEST_SERVERS:-required}"
# LGCKPT_CLOCK_SHIFT_DAYS=365: every Python process of the run sees the date a year ahead.
if [[ -n "${LGCKPT_CLOCK_SHIFT_DAYS:-}" ]]; then
    export PYTHONPATH="$root/tests/clock${PYTHONPATH:+:$PYTHONPATH}"
fi
"$python" -m ruff check .
"$python" -m mypy
exec "$python" -m pytest -n 2 -q -p no:cacheprovider "$@"
