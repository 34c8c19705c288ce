# The two commands of the README. Each does all of its own set-up (scripts/setup.sh is idempotent).
.PHONY: local test setup lint
local:
	./scripts/setup.sh
	.venv/bin/laps local $(ARGS)

# Lint first (seconds): a layer broken or an import cycle fails the run before any test starts.
# Then the suite in two parts, both always run: on two pytest-xdist workers (a test file whole on
# one worker, so its module fixtures run once), then the tests marked `alone` (why: the marker in
# pyproject.toml) with nothing beside them. Exit status 5 is "nothing selected" (PYTEST_ARGS
# picked tests of one part only).
test:
	./scripts/setup.sh --with-prometheus --with-sglang --with-controlplane
	$(MAKE) --no-print-directory lint
	.venv/bin/python -m pytest -n 2 --dist loadfile -m "not alone" $(PYTEST_ARGS); shared=$$?; \
	.venv/bin/python -m pytest -m alone $(PYTEST_ARGS); alone=$$?; \
	case "$$shared$$alone" in 00|05|50) ;; *) echo "make test: pytest exit status $$shared (on two workers), $$alone (alone)"; exit 1 ;; esac

# ruff (pyflakes, isort, bugbear; pyproject.toml) and the layers as contracts (.importlinter).
lint:
	.venv/bin/ruff check .
	.venv/bin/lint-imports --no-cache

setup:
	./scripts/setup.sh --with-prometheus --with-sglang --with-controlplane
