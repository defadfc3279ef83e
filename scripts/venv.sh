# Sourced by demo.sh, test.sh and test-latest.sh: the virtualenv they share and the locked install.
# Sets root, venv and python; `locked_install SPEC` installs the package (SPEC: "" or "[test]")
# with every dependency at the version requirements/test.txt names, the build backend included
# (--no-build-isolation: setuptools comes from the lock too, not from today's PyPI).

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LGCKPT_VENV:-$root/.venv}"
python="$venv/bin/python"
lock="$root/requirements/test.txt"

make_venv() {
    if [[ ! -x "$python" ]]; then
        echo "creating $venv" >&2
        "${PYTHON:-python3}" -m venv "$venv"
    fi
}

locked_install() {
    local pip=("$python" -m pip install --quiet --disable-pip-version-check)
    if [[ "$1" == "[test]" ]]; then
        "${pip[@]}" -r "$lock"
    else
        "${pip[@]}" -c "$lock" setuptools
    fi
    # A dependency missing from the lock would be installed at today's version here:
    # check_lock.py then fails on it (the test environment only).
    "${pip[@]}" --no-build-isolation -c "$lock" -e "$root$1"
    if [[ "$1" == "[test]" ]]; then
        "$python" "$root/scripts/check_lock.py"
    fi
}
