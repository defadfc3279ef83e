#!/usr/bin/env bash
# Set up and run the demo on a fresh machine: a virtualenv in the repo root (created if
# missing), the package installed into it (editable, its dependencies at the versions of
# requirements/test.txt), then scripts/demo.py with this
# script's arguments, e.g. `scripts/demo.sh --db /tmp/agent.db`. Works from any directory.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
stamp="$venv/.demo-installed"  # newer than pyproject.toml and the lock: the install is up to date

make_venv
if [[ ! -f "$stamp" || "$root/pyproject.toml" -nt "$stamp" || "$lock" -nt "$stamp" ]]; then
    echo "installing langgraph-ckpt-ext into $venv" >&2
    locked_install ""
    touch "$stamp"
fi

exec "$python" "$root/scripts/demo.py" "$@"
