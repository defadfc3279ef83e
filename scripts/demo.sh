#!/usr/bin/env bash
# Set up and run the demo on a fresh machine: a virtualenv in the repo root (created if
# missing), the package installed into it (editable), then scripts/demo.py with this
# script's arguments, e.g. `scripts/demo.sh --db /tmp/agent.db`. Works from any directory.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="$venv/bin/python"
stamp="$venv/.demo-installed"  # newer than pyproject.toml: the install is up to date

if [[ ! -x "$python" ]]; then
    echo "creating $venv" >&2
    "${PYTHON:-python3}" -m venv "$venv"
fi
if [[ ! -f "$stamp" || "$root/pyproject.toml" -nt "$stamp" ]]; then
    echo "installing langgraph-ckpt-ext into $venv" >&2
    "$python" -m pip install --quiet --disable-pip-version-check -e "$root"
    touch "$stamp"
fi

exec "$python" "$root/scripts/demo.py" "$@"
