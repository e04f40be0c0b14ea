# The two commands of the README. Each first runs scripts/setup.sh (idempotent).
export XDG_RUNTIME_DIR ?= /tmp/meganeura-xdg-$(shell id -u)

.PHONY: train test setup

train: setup
	@mkdir -p $(XDG_RUNTIME_DIR)
	.venv/bin/python examples/mlp_digits.py

test: setup
	@mkdir -p $(XDG_RUNTIME_DIR)
	.venv/bin/python -m pytest

setup:
	@bash scripts/setup.sh
