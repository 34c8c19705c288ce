# The two commands of the README. Each does all of its own set-up (scripts/setup.sh is idempotent).
.PHONY: local test setup lint
local:
	./scripts/setup.sh
	.venv/bin/laps local $(ARGS)

# Lint first (seconds): a layer broken or an import cycle fails the run before any test starts.
test:
	./scripts/setup.sh --with-prometheus --with-sglang --with-controlplane
	$(MAKE) --no-print-directory lint
	.venv/bin/python -m pytest $(PYTEST_ARGS)

# ruff (pyflakes, isort, bugbear; pyproject.toml) and the layers as contracts (.importlinter).
lint:
	.venv/bin/ruff check .
	.venv/bin/lint-imports --no-cache

setup:
	./scripts/setup.sh --with-prometheus --with-sglang --with-controlplane
