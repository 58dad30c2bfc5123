# Sourced by the GPU scripts from the repository root: wheels carried in .whl/ (what a bare GPU image lacks:
# torchao, tyro, ...) installed into /tmp/site and put on PYTHONPATH with the repository; PY is the Python to
# run (PYTHON if set, else the repository's .venv if there is one, else python3).
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
