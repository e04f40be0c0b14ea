# The two commands of the README. Each first runs scripts/setup.sh (idempotent).

.PHONY: train test setup

train: setup
	.venv/bin/python examples/mlp_digits.py

test: setup
	.venv/bin/python -m pytest

setup:
	@bash scripts/setup.sh
