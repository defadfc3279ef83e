#!/usr/bin/env bash
# The suite against the newest releases: what a user who installs the package today gets,
# instead of the versions requirements/test.txt pins. A virtualenv of its own (.venv-latest),
# every dependency upgraded to the newest release its range allows, then ruff, mypy and
# pytest as scripts/test.sh runs them. It goes on past a failing step, and ends with each
# step's result and every package whose version differs from the lock (what is new since the
# lock was made, and so what a failure may come from). CI does not run it; run it before
# `bash scripts/lock.sh`, to see what a refresh of the lock will need. Extra arguments go to
# pytest.
set -uo pipefail
LGCKPT_VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv-latest"
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"

make_venv
"$python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$python" -m pip install --quiet --disable-pip-version-check --upgrade --upgrade-strategy eager \
    -e "$root[test]" || exit 1

cd "$root"
export LGCKPT_TEST_SERVERS="${LGCKPT_TEST_SERVERS:-required}"
results=()
run() {
    local name="$1"; shift
    "$@"
    local rc=$?
    results+=("$name: $([[ $rc == 0 ]] && echo passed || echo "FAILED (exit $rc)")")
    return 0
}
run ruff "$python" -m ruff check .
run mypy "$python" -m mypy
run pytest "$python" -m pytest -n 2 -q -p no:cacheprovider "$@"

echo
echo "== newer than requirements/test.txt"
"$python" "$root/scripts/check_lock.py" --newer
echo "== results"
printf '%s\n' "${results[@]}"
[[ "${results[*]}" != *FAILED* ]]
