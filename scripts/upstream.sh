#!/usr/bin/env bash
# LangGraph's own tests on our savers: the tests of the sdist of the langgraph version the lock
# installs, with their `sync_checkpointer` / `async_checkpointer` fixtures bound to ours
# (tests/upstream/lgckpt_upstream.py names the savers). The sdist is downloaded once into
# .upstream/ (not committed) and its tests run from there against the installed packages.
#
#   bash scripts/upstream.sh                       # the full matrix, every file below
#   bash scripts/upstream.sh --savers sqlite,smart-events:sqlite  [pytest args...]
#   bash scripts/upstream.sh --quick --savers redis   # the representative part only
#   bash scripts/upstream.sh --ci                  # what CI runs (scripts/test.sh calls it)
#
# --savers LIST: comma-separated (default: the whole matrix); --quick: the files of the quick
# set only. Exit status is pytest's.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"

MATRIX="langgraph-memory,inmemory,sqlite,postgres,redis,redis-cluster,smart-events:sqlite,smart-every:postgres,smart-periodic:sqlite,smart-hybrid:redis,replicated-async:postgres"
FILES=(test_pregel.py test_pregel_async.py test_time_travel.py test_time_travel_async.py
       test_subgraph_persistence.py test_subgraph_persistence_async.py test_interruption.py
       test_interrupt_state.py test_strict_resume.py test_large_cases.py test_large_cases_async.py)
QUICK=(test_time_travel.py test_time_travel_async.py test_subgraph_persistence.py
       test_subgraph_persistence_async.py test_interruption.py test_interrupt_state.py
       test_strict_resume.py)

TIMED="test_stream_subgraphs_during_execution or test_stream_buffering_single_node"
TIMED+=" or test_parallel_node_execution or test_sync_streaming_with_functional_api"

savers="$MATRIX"
files=("${FILES[@]}")
while [[ $# -gt 0 ]]; do
    case "$1" in
        --savers) savers="$2"; shift 2 ;;
        --quick) files=("${QUICK[@]}"); shift ;;
        --ci)  # what CI runs (scripts/test.sh): all of it on two savers, the quick part on five;
            # without LangGraph's tests that assert wall-clock gaps of 0.1 s (on a busy machine
            # they fail on every saver, InMemorySaver included; the full matrix runs them)
            bash "$0" --savers "sqlite,smart-events:sqlite" -k "not ($TIMED)" "${@:2}"
            exec bash "$0" --quick \
                --savers "inmemory,postgres,redis,redis-cluster,replicated-async:postgres" "${@:2}" ;;
        *) break ;;
    esac
done

make_venv
if [[ -z "${LGCKPT_UPSTREAM_NO_INSTALL:-}" ]]; then
    locked_install "[test]"
fi
version="$("$python" -c 'import importlib.metadata as m; print(m.version("langgraph"))')"
src="$root/.upstream/langgraph-$version"
if [[ ! -f "$src/.bound" ]]; then
    rm -rf "$src"
    mkdir -p "$root/.upstream"
    work="$(mktemp -d)"
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary :all: "langgraph==$version" -d "$work"
    tar -xzf "$work/langgraph-$version.tar.gz" -C "$root/.upstream"
    rm -rf "$work" "$src/langgraph"  # the installed langgraph is the one tested
    cat >> "$src/tests/conftest.py" <<'PY'

# appended by langgraph-ckpt-ext's scripts/upstream.sh: the fixtures bound to its savers
from lgckpt_upstream import async_checkpointer, sync_checkpointer  # noqa: E402,F401,F811
PY
    touch "$src/.bound"
fi

cd "$src"
export PYTHONPATH="$root/tests/upstream${PYTHONPATH:+:$PYTHONPATH}"
export LGCKPT_UPSTREAM_SAVERS="$savers" NO_DOCKER=true
echo "LangGraph $version's own tests on: $savers" >&2
tests=()
for f in "${files[@]}"; do tests+=("tests/$f"); done
exec "$python" -m pytest -n "${LGCKPT_UPSTREAM_WORKERS:-2}" -q -p no:cacheprovider \
    -o addopts="--strict-markers --snapshot-warn-unused" "${tests[@]}" "$@"
