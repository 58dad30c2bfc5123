#!/usr/bin/env bash
# Install a headless browser for the dashboard tests (tests/test_dashboard_browser.py, marked `browser`):
# Debian's chromium and chromium-driver (built from one source package, so their versions always match) and the
# selenium Python package (the `browser` extra) into the project's environment.
#
#     scripts/install_browser.sh            # into .venv if there is one, else the python3 on PATH
#     PYTHON=/path/to/python scripts/install_browser.sh
#
# Needs apt-get (Debian or Ubuntu) and root or sudo. Without a browser the browser tests are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! command -v apt-get >/dev/null; then
    echo "install_browser.sh: no apt-get here; install chromium and chromedriver yourself, then: $PY -m pip install 'selenium>=4.20,<5'" >&2
    exit 1
fi
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver
fi
"$PY" -m pip install -q "selenium>=4.20,<5"
/usr/bin/chromium --version
/usr/bin/chromedriver --version
"$PY" -c 'import selenium; print("selenium", selenium.__version__)'
