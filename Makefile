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

# A CPU-sized A/B sweep on the built-in real JPEGs: the JPEG decoder x channels_last, 4 jobs of 6
# epochs of the small CNN, about 40 s on 2 cores of any CPU kind (no flag that a CPU may only
# emulate), every row learning to about 0.99 val_acc (chance is 0.1). See the README for why.
demo: setup
	$(PY) train.py -m data=builtin data.image_size=32 trainer.max_epochs=6 data.decoder=pil,turbo channels_last=false,true

test: setup
	$(PY) -m pytest -q --durations=15
