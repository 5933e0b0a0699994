# Sourced by run_train.sh and run_tests.sh: install titanlite into the current Python
# environment on first use, so a fresh clone needs nothing but Python and pip.
#
# torch is installed first, pinned to the version titanlite is tested with, because an
# unpinned resolve can pull a multi-GB build that the user did not ask for. Set
# TITANLITE_TORCH_SPEC (e.g. "torch==2.13.0" or "torch>=2.7") to choose another.

PYTHON="${PYTHON:-python3}"
TITANLITE_TORCH_SPEC="${TITANLITE_TORCH_SPEC:-torch==2.13.0}"

titanlite_ensure_installed() {
    local extra="$1" modules="$2"
    # find_spec, not import: the check costs milliseconds instead of a torch import.
    if "$PYTHON" -c "import importlib.metadata as m, importlib.util as u, sys; m.version('titanlite'); sys.exit(any(u.find_spec(x) is None for x in '${modules}'.split()))" 2>/dev/null; then
        return 0
    fi
    echo "titanlite: not installed in $("$PYTHON" -c 'import sys; print(sys.prefix)'); installing it (first use only)..." >&2
    if ! "$PYTHON" -c "import torch" 2>/dev/null; then
        "$PYTHON" -m pip install --quiet "$TITANLITE_TORCH_SPEC" || return 1
    fi
    "$PYTHON" -m pip install --quiet -e ".${extra:+[$extra]}" || return 1
    echo "titanlite: installed." >&2
}
