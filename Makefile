# Two commands for a fresh machine (Python 3.11, no GPU needed):
#   make suite   set up .venv, run the cpu-smoke notebook suite, print where index.html is
#   make test    set up .venv, run the tests, then the regression gate against data/golden/cpu-smoke.json
# TORCH picks the torch build: the default is the CPU build the lab's CI uses. EXTRAS: lab (notebooks),
# dev (tests), aiter-triton (AITER's Triton kernels from the amd-aiter wheel, for machines without a
# source-built aiter), gpu (flash-linear-attention; its recurrent kernel also runs in the interpreter),
# hf (transformers: Hugging Face models built from configs for the trace tests and benchmark).
# constraints.txt holds the versions CI tested; `make constraints` records the current .venv's.
PYTHON ?= python3
TORCH ?= torch==2.13.0
EXTRAS ?= lab,dev,aiter-triton,gpu,hf
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup suite test lint constraints clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/activate pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	touch $@

setup: $(VENV)/.installed

suite: setup
	$(BIN)/gdn-lab run --preset cpu-smoke --jobs 2 --out runs/cpu-smoke

test: setup
	$(BIN)/python -m pytest -q
	$(BIN)/gdn-lab check --golden data/golden/cpu-smoke.json --quiet

lint: setup
	$(BIN)/ruff check gdn_lab tests benchmarks
	$(BIN)/ruff format --check gdn_lab tests benchmarks

# After a green `make test` with newer dependencies: record them as the tested set.
constraints: setup
	{ sed -n '1,3p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v -E '^(torch|py-spy)=='; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt

clean:
	rm -rf $(VENV) runs
