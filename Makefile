# The two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tandem-installed

.PHONY: run test test-slow bench gpu-check lint docs format clean lightning-suite

# torch is installed first and pinned: a bare `torch` would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) examples/digits.py

test: $(STAMP)
	$(PY) -m pytest -m "not slow and not trackers"

# multi-process Lightning ports, the two-node network lab (root + iproute2; skipped with a reason otherwise),
# the W&B / MLflow loggers against their real clients (offline W&B, a local mlflow server), and fault
# tolerance on torchft with its lighthouse (the lab)
test-slow: $(STAMP)
	$(PY) -m pip install -q -e ".[notebook,trackers,docs,fault-tolerance]"
	$(PY) -m pytest -m "slow or trackers"

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/tensorboard_events.py
	$(PY) benchmarks/ddp.py

# what Tandem must do on a GPU (issue 41), at most 8 minutes on one GPU: one line per check, JSON in
# benchmarks/results/gpu_check.json and the "On a GPU" summary in docs/benchmarks.md; without CUDA it says so
# and exits 0 (`python benchmarks/gpu_check.py --device cpu` is the dry run)
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py --write-docs

# Lightning's own tests (tests/tests_pytorch of the installed version's tag, from a clone given by LIGHTNING_MIRROR)
# under real Lightning, then against Tandem through names-only aliases; the table goes into docs/porting.md
lightning-suite: $(STAMP)
	$(PY) tools/lightning_suite/run.py

# ruff, then the layers: one import direction and no import circle (pyproject.toml [tool.importlinter]), then
# no function of the training loop above cyclomatic complexity 25 (radon's count: tools/complexity.py)
lint: $(STAMP)
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) tools/complexity.py trainer/loop 25

# the guides and the API reference (docstrings) as a static site in site/; strict: a broken link or a public
# name without a docstring fails the build
docs: $(STAMP)
	$(PY) -m pip install -q -e ".[docs]"
	$(VENV)/bin/mkdocs build --strict

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) build site *.egg-info
