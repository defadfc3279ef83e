#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh machine: a virtualenv in the repo root
# (created if missing), the package with its test extras at the versions requirements/test.txt
# pins, then ruff, mypy and pytest on two workers, then LangGraph's own tests on our savers
# (scripts/upstream.sh --ci). Extra arguments go to pytest, and run our suite only, e.g.
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
if [[ $# -gt 0 || "${LGCKPT_UPSTREAM:-1}" == "0" ]]; then
    # a part of the suite (or LGCKPT_UPSTREAM=0): ours only
    exec "$python" -m pytest -n 2 -q -p no:cacheprovider "$@"
fi
"$python" -m pytest -n 2 -q -p no:cacheprovider
# LangGraph's own tests on our savers (scripts/upstream.sh --ci: all of them on SQLite and
# on SmartCheckpointer, the representative part on the other backends and the replicated one)
LGCKPT_UPSTREAM_NO_INSTALL=1 exec bash "$root/scripts/upstream.sh" --ci
