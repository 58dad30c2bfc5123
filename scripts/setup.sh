#!/usr/bin/env bash
# Create .venv (if missing) and install redline into it with the given extras, e.g. `scripts/setup.sh test`.
# Idempotent: re-running with the same pyproject.toml and extras does nothing.
# TORCH selects the torch requirement installed first when the venv has none (default: a pinned release, so
# pip does not pull the newest CUDA build on machines that want the CPU one; set TORCH="torch" for the newest).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
TORCH="${TORCH:-torch==2.13.0}"
EXTRAS="${1:-}"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "redline needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
stamp="$VENV/.redline-installed"
want="$(cat pyproject.toml | sha256sum | cut -c1-16) extras=[$EXTRAS]"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q "$TORCH"
fi
spec="."
[ -n "$EXTRAS" ] && spec=".[$EXTRAS]"
"$VENV/bin/python" -m pip install -q -e "$spec"
echo "$want" > "$stamp"
