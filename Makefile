# Two commands on a fresh machine (see README):  make demo   |   make test
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test
setup: $(VENV)/.installed

# exact versions from constraints.txt (pyproject.toml only holds ranges)
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $@

# A CPU-sized A/B sweep of the ResNet-50 recipe on built-in synthetic data (a few minutes on 2 cores).
demo: setup
	$(PY) train.py -m +recipe=resnet50 scale=smoke amp=false,true channels_last=false,true

test: setup
	$(PY) -m pytest -q --durations=15
