# The two quick-start commands (README): `make demo` and `make test`. Each sets up .venv from nothing.
VENV ?= .venv

.PHONY: demo test setup

demo:
	@scripts/setup.sh
	$(VENV)/bin/redline train

test:
	@scripts/setup.sh test
	$(VENV)/bin/python -m pytest -q

setup:
	@scripts/setup.sh test
