#!/usr/bin/env bash
# Install torch (pinned, first) and surgery with its extras into a virtual environment.
#
#   examples/install.sh VENV EXTRAS [TORCH_INDEX_URL]      e.g. examples/install.sh .venv plots
#
# Makes VENV when it does not exist. torch comes first and pinned, so that surgery's own requirement
# does not choose another build; TORCH_INDEX_URL takes it from that index (PyPI's Linux wheels bring
# the CUDA libraries, GBs: https://download.pytorch.org/whl/cpu has the CPU-only builds).
#
# The installer is uv when pip can fetch it (uv downloads in parallel: 1.7 min instead of 9 for the
# test environment on 2 cores, docs/install.md), else pip. uv reads its own settings, not pip's, so
# the package sources pip is configured with (environment variables or pip.conf: find-links, index,
# extra indexes, constraints) are handed to it as uv's; settings of uv's own (UV_*) win.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: examples/install.sh VENV EXTRAS [TORCH_INDEX_URL]" >&2; exit 2; }
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV=$1
EXTRAS=$2
TORCH_INDEX=${3:-}
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
TARGET="$REPO${EXTRAS:+[$EXTRAS]}"

# pip_setting NAME: pip's effective value of a global setting (its environment variable first, then
# its configuration files), empty when unset.
pip_setting() {
    local var="PIP_$(tr 'a-z-' 'A-Z_' <<< "$1")"
    if [[ -n "${!var:-}" ]]; then
        echo "${!var}"
    else
        "$PY" -m pip config get "global.$1" 2>/dev/null || true
    fi
}

if "$PY" -m pip install -q --disable-pip-version-check uv 2>/dev/null; then
    links=$(pip_setting find-links); index=$(pip_setting index-url)
    extra=$(pip_setting extra-index-url); constraint=$(pip_setting constraint)
    # uv takes find-links comma-separated, pip (and uv's other lists) whitespace-separated
    [[ -z "$links" ]] || export UV_FIND_LINKS="${UV_FIND_LINKS:-$(echo $links | tr ' ' ',')}"
    [[ -z "$index" ]] || export UV_INDEX_URL="${UV_INDEX_URL:-$index}"
    [[ -z "$extra" ]] || export UV_EXTRA_INDEX_URL="${UV_EXTRA_INDEX_URL:-$(echo $extra)}"
    # pip picks the best version across all its indexes; uv by default only from the first one holding the name
    [[ -z "$index$extra" ]] || export UV_INDEX_STRATEGY="${UV_INDEX_STRATEGY:-unsafe-best-match}"
    [[ -z "$constraint" ]] || export UV_CONSTRAINT="${UV_CONSTRAINT:-$(echo $constraint)}"
    # --compile-bytecode: pip writes every module's bytecode as it installs, uv only when asked
    install() { "$PY" -m uv pip install --quiet --compile-bytecode --python "$PY" "$@"; }
else
    echo "note: uv could not be installed; installing with pip (slower)" >&2
    install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
fi
install torch==2.13.0 ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
install -e "$TARGET"
# The project's own modules compiled too (an editable install leaves them as sources). Without
# bytecode every command compiles what it imports, each time where PYTHONDONTWRITEBYTECODE is set
# or the folder is read-only: torch, transformers and surgery, ~8 CPU-s a command on 2 cores.
"$PY" -m compileall -q "$REPO/surgery" > /dev/null
