# Sourced by the scripts that set up a Python venv from a pinned requirements file
# (tests/interop/setup_venv.sh, tests/deploy/setup_venv.sh, docs/setup_mdbook.sh).
#
#   pinned_venv LABEL VENV REQUIREMENTS CHECK [PIP_ARGS...]
#
# Creates VENV (or reuses it) with REQUIREMENTS installed. Idempotent: a stamp file in VENV holds
# the sha256 of REQUIREMENTS; when it matches and CHECK (a command, e.g. a shell function, that
# succeeds when what the venv is for works) passes, nothing is installed. Progress and errors go
# to stderr, prefixed with LABEL; any failure exits with a message saying what to do.

pinned_venv() {
    local label="$1" venv="$2" req="$3" check="$4"
    shift 4
    local stamp="$venv/.requirements.sha256" py="$venv/bin/python" want
    fail() {
        echo "$label: ERROR: $*" >&2
        exit 1
    }
    command -v python3 >/dev/null 2>&1 || fail "python3 not found on PATH (need Python with the venv module)"
    [ -f "$req" ] || fail "missing $req"
    want="$(python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$req")"
    if [ -x "$py" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$check" 2>/dev/null; then
        echo "$label: reusing $venv (requirements unchanged)" >&2
        return
    fi
    rm -f "$stamp"
    if [ ! -x "$py" ]; then
        echo "$label: creating $venv" >&2
        python3 -m venv "$venv" || fail "'python3 -m venv $venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
    echo "$label: installing $req" >&2
    "$py" -m pip install --disable-pip-version-check --no-input --timeout 60 -q "$@" -r "$req" >&2 ||
        fail "pip install -r $req failed (see pip output above)"
    "$check" || fail "installed, but what $venv is for does not work ($check fails; see above)"
    echo "$want" >"$stamp"
    echo "$label: installed into $venv" >&2
}
