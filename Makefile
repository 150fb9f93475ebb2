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

# A CPU-sized A/B sweep of the ResNet-50 recipe on the built-in real JPEGs: 4 jobs of 6 epochs,
# about 1.5 minutes on 2 cores, the baseline reaching about 0.8 val_acc (chance is 0.1).
demo: setup
	$(PY) train.py -m +recipe=resnet50 scale=smoke data=builtin trainer.max_epochs=6 trainer.limit_train_batches=1.0 trainer.limit_val_batches=1.0 amp=false,true channels_last=false,true

test: setup
	$(PY) -m pytest -q --durations=15
