# varbench — every target installs into .venv first (make setup).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
WORLD   ?= tiny

.PHONY: setup test test-all lint table1 table2 table3 table4 table5 tables leaderboard setup-browser figures tiny-models tiny-t2i mutation mutation-tokens mutation-infra mutation-core mutation-pruning mutation-measure clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

test-all: setup
	$(BIN)/python -m pytest -q -m ''

lint: setup
	$(BIN)/ruff check bench methods tests

table1 table2 table3 table4 table5: setup
	$(BIN)/varbench table evar-$@ --world $(WORLD)

tables: setup
	$(BIN)/varbench table all --world $(WORLD)

leaderboard: setup
	$(BIN)/varbench leaderboard --world $(WORLD)

# Headless Chromium and its WebDriver (Debian's chromium, chromium-driver: /usr/bin/chromium,
# /usr/bin/chromedriver) for the leaderboard page's browser test (tests/test_leaderboard_browser.py,
# marked slow and browser; it skips without them). Needs root, else sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
setup-browser:
	$(SUDO) apt-get update
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver
	/usr/bin/chromium --version && /usr/bin/chromedriver --version

figures: setup
	$(BIN)/varbench figures --world $(WORLD)

tiny-models: setup
	$(BIN)/varbench train-tiny --out assets/tiny

# Mutation score of the model, pruning and method code. NOT part of `make test`: ~40 min on 2 CPUs (mutmut 18, decorated 7, recheck 12).
# 1) mutmut 3 mutates bench/models/{var,vqvae,generator,policy}.py, bench/prune.py, methods/{magnitude,ft}.py in a
#    mutants/ copy ([tool.mutmut] in pyproject.toml: scope, fast test set, -x -q -p no:cacheprovider)
#    and runs per mutant only the fast tests that reach the mutated function;
# 2) mutmut skips decorated functions (the @torch.no_grad() sampling loop, keep_heads/keep_channels,
#    Magnitude.scores): tests/mutation/run.py mutates those itself (AST edits, one fork per mutant);
# 3) tests/mutation/run.py --recheck runs the slow tests left out of 1) on the survivors of the
#    sampling, attention/AdaLN, quantiser and pruning code; --summary prints the per-file score
#    (killed / total) and lists every mutant not killed. Results are cached in mutants/ (a rerun of
#    1) resumes; `rm -rf mutants` starts over). Inspect one: `$(BIN)/mutmut show NAME`.
MUTMUT_JOBS ?= 1
mutation: setup
	$(BIN)/python -m pip install --quiet -e '.[dev,mutation]'
	$(BIN)/mutmut run --max-children $(MUTMUT_JOBS)
	$(BIN)/python tests/mutation/run.py
	$(BIN)/python tests/mutation/run.py --recheck
	$(BIN)/python tests/mutation/run.py --summary

# Mutation score of the token methods (FastVAR, LazyVAR, StepVAR, ToMe: scoring, selection, restoration,
# schedules), each function against its method's tests (tests/mutation/run.py --tokens). NOT part of
# `make test` or `make mutation`: ~750 mutants, hours on 2 CPUs; `--only NAME` runs one function.
mutation-tokens: setup
	$(BIN)/python tests/mutation/run.py --tokens
	$(BIN)/python tests/mutation/run.py --summary

# Mutation score of what turns records into the numbers users read: table cells (relative columns, Kendall's
# tau), the leaderboard's ranks and error bars, sharded merges, sweeps and the fidelity metrics, each function
# against its own test file (tests/mutation/run.py --infra). NOT part of `make test`: ~900 mutants, about an
# hour on 2 CPUs; `--only NAME` runs one function.
mutation-infra: setup
	$(BIN)/python tests/mutation/run.py --infra
	$(BIN)/python tests/mutation/run.py --summary

# Mutation score of run identity: method specs and their canonical spelling, the sampling and seed checks,
# run keys, record validation, migration, lookup and staleness (tests/mutation/run.py --core), against the records,
# spec, make_spec, staleness, registry and CLI-input tests (table_cells: the table tests). NOT part of `make test`:
# ~1000 mutants, about an hour on 2 CPUs.
mutation-core: setup
	$(BIN)/python tests/mutation/run.py --core
	$(BIN)/python tests/mutation/run.py --summary

# Mutation score of the structured pruners and the recovery losses: OBS with compensation and its calibration
# Hessians (EVAR, SlimGPT), the gradient scores (Taylor, LLM-Pruner, OBA), the pruner base, the shared training
# loop and the distillation losses (PSAD, KD), each against its own tests (tests/mutation/run.py --pruning).
# NOT part of `make test`: ~900 mutants, about an hour on 2 CPUs; `--only NAME` runs one function.
mutation-pruning: setup
	$(BIN)/python tests/mutation/run.py --pruning
	$(BIN)/python tests/mutation/run.py --summary

# Mutation score of the cost columns: parameter and FLOP counts (VAR, text-to-image, HART, decoders), KV-cache
# sizes, the info contract, and the latency bench's statistics, per-scale attribution and report
# (tests/mutation/run.py --measure). NOT part of `make test`: ~900 mutants, about two hours on 2 CPUs.
mutation-measure: setup
	$(BIN)/python tests/mutation/run.py --measure
	$(BIN)/python tests/mutation/run.py --summary

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# tiny-t2i (the Infinity class, tiny) from scratch: BSQ VAE, transformer + text encoder, quality bars.
tiny-t2i: setup
	$(BIN)/python -m bench.recipes.tiny_t2i --out assets/tiny
