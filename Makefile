# Exact by Construction: `make` builds the site, `make test` runs every test.
# Everything runs inside .venv, created here from requirements.txt with the machine's python3.

PYTHON ?= python3
# The Python versions the pins in requirements.txt install on (README, "Two commands").
SUPPORTED := 3.11 3.12 3.13
VENV   := .venv
BIN    := $(VENV)/bin
SITE   := _build/html
PY_SOURCES := specdec_core.py specdec scripts tests
CHAPTERS := $(wildcard book/*.md)
NOTEBOOKS := $(patsubst book/%.md,book/_notebooks/%.ipynb,$(filter book/ch%,$(CHAPTERS)))

# Jupyter reads and writes its settings inside the venv, never in the user's home.
export JUPYTER_CONFIG_DIR := $(CURDIR)/$(VENV)/etc/jupyter
export JUPYTER_DATA_DIR := $(CURDIR)/$(VENV)/share/jupyter
export JUPYTER_PLATFORM_DIRS := 1
# IPython's and matplotlib's settings and caches too (the kernels' history, the font cache).
export IPYTHONDIR := $(CURDIR)/$(VENV)/share/ipython
export MPLCONFIGDIR := $(CURDIR)/$(VENV)/share/matplotlib
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: all site test figures notebooks lab bench stopwatch race train train-large engines lint clean distclean pdf

all: site

# The interpreter's version, and that of the one in .venv (empty where there is none).
VERSION_OF = $(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYTHON_VERSION := $(call VERSION_OF,$(PYTHON))
VENV_VERSION := $(call VERSION_OF,$(BIN)/python)

# A .venv made by another Python (or half made) is made anew.
ifneq ($(VENV_VERSION),$(PYTHON_VERSION))
.PHONY: $(BIN)/.installed
endif

$(BIN)/.installed: requirements.txt pyproject.toml scripts/ipython_kernel_config.py
	@case " $(SUPPORTED) " in *" $(PYTHON_VERSION) "*) ;; *) \
	  echo "make: $(PYTHON) is Python $(or $(PYTHON_VERSION),(not found)); this book needs" \
	    "one of $(SUPPORTED): run make PYTHON=python3.12, say" >&2; exit 1;; esac
	$(if $(filter $(PYTHON_VERSION),$(VENV_VERSION)),,rm -rf $(VENV))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	mkdir -p $(VENV)/etc/ipython
	cp scripts/ipython_kernel_config.py $(VENV)/etc/ipython/
	touch $@

$(BIN)/.test-installed: $(BIN)/.installed requirements-test.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $@

$(BIN)/.lab-installed: $(BIN)/.installed requirements-lab.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-lab.txt
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp scripts/lab-overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $@

# This machine's roofs, measured by the first chapter that needs them and read by the others
# (specdec/roofs.py, machine_rates), so that chapters 8 and 9 print one measurement; made anew
# with the execution cache.
RATES := $(CURDIR)/_build/machine-rates.json

# The execution cache keys on a chapter's own code only: drop it, and the pages and images made
# from it, whenever a module (the front door or the package), its shipped data (weights, corpus,
# stored results) or the installed packages change.
_build/.core-stamp: specdec_core.py $(wildcard specdec/*.py specdec/weights/* specdec/data/*) \
		$(wildcard specdec/*.js specdec/vendor/*) \
		$(BIN)/.installed
	rm -rf _build/.jupyter_cache _build/.doctrees _build/jupyter_execute $(SITE) $(RATES)
	@mkdir -p $(@D)
	touch $@

## make: execute every chapter (cached) and build the HTML site, warnings as errors
site: $(BIN)/.installed $(NOTEBOOKS) _build/.core-stamp
	SPECDEC_STATIC_SITE=1 SPECDEC_RATES=$(RATES) $(BIN)/jupyter-book build . --warningiserror --nitpick --keep-going
	@echo "The site is at $(CURDIR)/$(SITE)/index.html"

## make test: lint, unit tests of the core, every chapter executed, and the built site checked
test: site $(BIN)/.test-installed
	$(BIN)/ruff check $(PY_SOURCES)
	$(BIN)/ruff format --check $(PY_SOURCES)
	$(BIN)/python -m pytest -n 2 --dist worksteal  # two workers: the longest test beside the rest

## make figures: every figure of the book as PNG and SVG in figures/, without the site
figures: $(BIN)/.installed
	MPLBACKEND=Agg $(BIN)/python scripts/figures.py figures

## make notebooks: .ipynb copies of the chapters in book/_notebooks (git-ignored)
notebooks: $(NOTEBOOKS)

book/_notebooks/%.ipynb: book/%.md $(BIN)/.installed scripts/export_notebook.py
	@mkdir -p $(@D)
	$(BIN)/python scripts/export_notebook.py $< $@

## make lab: JupyterLab on the chapters as notebooks with their numbers and figures (the
## archive's notebooks, _build/notebooks, written by the site build)
lab: $(BIN)/.lab-installed site
	$(BIN)/jupyter lab --notebook-dir=_build/notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

## make pdf: the whole book as one PDF, _build/pdf/exact-by-construction.pdf: the machine's
## headless chromium prints a single-page build (no browser is downloaded)
pdf: site
	SPECDEC_STATIC_SITE=1 SPECDEC_RATES=$(RATES) $(BIN)/jupyter-book build . --builder singlehtml --warningiserror --nitpick --keep-going
	$(BIN)/python scripts/pdf.py _build/singlehtml/book/intro.html _build/pdf/exact-by-construction.pdf

## make bench: time the literal loops against the vectorised engine
bench: $(BIN)/.installed
	$(BIN)/python scripts/bench.py

## make stopwatch: race plain against speculative decoding through chapter 8's transformers
stopwatch: $(BIN)/.installed
	$(BIN)/python scripts/stopwatch.py

## make race: chapter 9's race at full size through ONNX Runtime, predicted from costs timed beside it;
## ends with the large target's line `measured speedup X (95 % CI lo–hi) ... theorem 3.8 Z`
race: $(BIN)/.installed
	$(BIN)/python scripts/race.py

## make train: retrain chapter 9's pair with JAX (in .venv-train, never in the book's .venv) into
## _build/train and compare every held-out loss and α with the shipped manifest (within 0.01)
TRAIN_BIN := .venv-train/bin
$(TRAIN_BIN)/.installed: requirements-train.txt
	$(PYTHON) -m venv .venv-train
	$(TRAIN_BIN)/pip install --quiet --disable-pip-version-check -r requirements-train.txt
	touch $@

train: $(TRAIN_BIN)/.installed
	$(TRAIN_BIN)/python scripts/train_pair.py --check _build/train

## make train-large: retrain chapter 9's bandwidth-bound target (4 × 512, float16-stored) into
## _build/train-large and compare its losses and every draft's α with the shipped manifest
train-large: $(TRAIN_BIN)/.installed
	$(TRAIN_BIN)/python scripts/train_large.py --check _build/train-large

## make engines: the audit on released engines' own code (transformers 5.25.0, 4.44.2, 4.45.0;
## vLLM 0.6.3's V0 sampler from its wheel), each in a venv under .venv-engines (never the book's
## .venv), a line per target; writes specdec/data/engines.json, which chapter 6 reads.
## torch==2.13.0 (requirements-engines/base.txt): where pip's find-links holds the CPU wheel
## 2.13.0+cpu (this machine: /opt/wheels) pip picks it, about 0.75 GB installed; elsewhere the
## same pin installs the package index's default build with its CUDA libraries, about 6 GB.
## ENGINES="name;name" runs only those targets (names as in specdec/engines.py's TARGETS).
engines:
	$(PYTHON) scripts/engines.py $(if $(ENGINES),"$(subst ;," ",$(ENGINES))")

## make lint: ruff (check and format) over the core, the transformer, the scripts and the tests
lint: $(BIN)/.test-installed
	$(BIN)/ruff check $(PY_SOURCES)
	$(BIN)/ruff format --check $(PY_SOURCES)

## make clean: remove the site, the execution cache, figures and notebooks (keeps .venv)
clean:
	rm -rf _build figures book/_notebooks

## make distclean: clean, and remove .venv too
distclean: clean
	rm -rf $(VENV) .venv-train .venv-engines
