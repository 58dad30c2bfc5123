# The two quick-start commands (README): `make demo` and `make test`. Each sets up .venv from nothing.
VENV ?= .venv

.PHONY: demo test test-all setup

demo:
	@scripts/setup.sh
	$(VENV)/bin/redline train

# the fast suite (CI runs this); `make test-all` adds the tests marked slow (multi-process, compile, end to end)
test:
	@scripts/setup.sh test
	$(VENV)/bin/python -m pytest -q -m "not slow"

test-all:
	@scripts/setup.sh test
	$(VENV)/bin/python -m pytest -q

setup:
	@scripts/setup.sh test
