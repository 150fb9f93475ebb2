# Two commands on a fresh machine (see README):  make demo   |   make test
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-demo demo test test-fast lint
setup: $(VENV)/.installed
setup-demo: $(VENV)/.installed-demo

# exact versions from constraints.txt (pyproject.toml only holds ranges). The demo installs what it
# runs (the runtime dependencies and the fast JPEG decoder, [turbo]); the tests everything they use
# ([test]: DALI, MLflow, W&B, moto, ...). tests/test_readme.py checks that the demo's install pulls in
# nothing only the tests need.
DEMO_EXTRAS := turbo
$(VENV)/.installed-demo: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[$(DEMO_EXTRAS)]'
	touch $@

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $@ $(VENV)/.installed-demo

# The tests' MLflow tracking server, in its own venv: the server needs pyarrow<26, the product pins a
# newer one (the product itself talks to MLflow through mlflow-skinny, in .venv).
SERVER_VENV ?= .venv-mlflow-server
$(SERVER_VENV)/.installed: constraints-mlflow-server.txt
	python3 -m venv $(SERVER_VENV)
	$(SERVER_VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints-mlflow-server.txt mlflow
	touch $@

# A CPU-sized A/B sweep on the built-in real JPEGs: the JPEG decoder x channels_last, 4 jobs of 6
# epochs of the small CNN, about 40 s on 2 cores of any CPU kind (no flag that a CPU may only
# emulate), every row learning to about 0.99 val_acc (chance is 0.1). See the README for why.
demo: setup-demo
	$(PY) train.py -m data=builtin data.image_size=32 trainer.max_epochs=6 data.decoder=pil,turbo channels_last=false,true

# The suite in two parts: most tests on two pytest-xdist workers, each pinned to its own core (the
# runs it starts see a one-core machine, so neither competes with the other's timings), then the
# tests that need every core (several ranks, a Slurm cluster, a machine-wide measurement) alone.
# Both parts run; the exit status says whether either failed.
test: setup $(SERVER_VENV)/.installed
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not whole_machine" --durations=25; a=$$?; \
	$(PY) -m pytest -q -m whole_machine --durations=10; b=$$?; \
	exit $$(( a != 0 || b != 0 ))

# The edit-test loop: the in-process tests, on two workers (under 3 minutes on 2 cores).
test-fast: setup
	$(PY) -m pytest -q -n 2 -m "not slow and not whole_machine"

# Style and the package's layers, as CI checks them (pyproject.toml's [tool.ruff] and [tool.importlinter]);
# `$(VENV)/bin/ruff format .` fixes the layout.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
