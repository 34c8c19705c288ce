# The two commands of the README. Each does all of its own set-up (scripts/setup.sh is idempotent).
.PHONY: local test setup
local:
	./scripts/setup.sh
	.venv/bin/laps local $(ARGS)

test:
	./scripts/setup.sh --with-prometheus --with-sglang
	.venv/bin/python -m pytest $(PYTEST_ARGS)

setup:
	./scripts/setup.sh --with-prometheus --with-sglang
