# varbench — every target installs into .venv first (make setup).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
WORLD   ?= tiny

.PHONY: setup test test-all lint table1 table2 table3 table4 table5 tables leaderboard setup-browser figures tiny-models tiny-t2i tiny-t2i-gpu mutation mutation-tokens mutation-infra mutation-core mutation-pruning mutation-measure mutation-scoring mutation-models mutation-plumbing mutation-runs mutation-surface mutation-figures mutation-cards clean

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

# Mutation scores of the driver's groups (tests/mutation/run.py --GROUP; each function against its own tests,
# results in mutants/GROUP-results.json, tokens: token-results.json; `--only NAME` runs one function). NOT part of `make test` or `make mutation`;
# sizes on 2 CPUs:
#   mutation-tokens   the token methods (FastVAR, LazyVAR, StepVAR, ToMe): ~750 mutants, hours
#   mutation-infra    table cells, the leaderboard, sharded merges, sweeps, fidelity metrics: ~900, about an hour
#   mutation-core     run identity: method specs, sampling/seed checks, run keys, records, staleness: ~1000, an hour
#   mutation-pruning  OBS and its calibration (EVAR, SlimGPT), gradient scores, the pruner base, the training loop
#                     and the distillation losses (PSAD, KD): ~930, about an hour
#   mutation-measure  parameter, FLOP and KV-cache counts, the latency bench's statistics and report: ~890, two hours
#   mutation-scoring  the procedural datasets (tinyshapes, shapes scenes), the scene detector and checks, GenEval's
#                     scoring rules and colour classifier, the tiny feature network: ~2400, three hours or more
#   mutation-models   the text-to-image models against their golden outputs (Infinity, BSQ VAE, tiny text encoder
#                     and sampler, HART, its tokenizer and diffusion head): ~2400, several hours
#   mutation-plumbing checkpoint reading and strict loading, manifests, atomic writes and git provenance, HART's
#                     config read from its folder, the paper-world metric files, the Core ML export and op counts:
#                     ~1230; about an hour and a half without `export` (114 mutants, ~40 s each against the export tests)
#   mutation-runs     spec to record: the runner (reuse, preflight, sampling by batches and chunks, metric, cost and
#                     timing fields), the original model's cached outputs for FID*, the benches' labels, seeds, checks
#                     and folder layouts: ~1200, two hours or more (the runner's `run`: ~50 s a mutant)
#   mutation-surface  what a user types and reads: the varbench commands' checks, messages, exit codes and printed
#                     numbers, the default folders and the package's data, the sample grid, the metric catalogue:
#                     ~1270, two hours or more (two drivers on disjoint `--only` sets: about half)
#   mutation-figures  the ablation and trade-off figures: points, Pareto fronts, sweep series, table bars, PSAD's gate
#                     curves, the spec checks and empty-figure messages: ~1470, about two hours (two drivers: one)
#   mutation-cards    the models' configs and cards: official sizes, pruned block sizes, Infinity's scale schedules,
#                     image sizes, where files are looked for and what a missing one says, strict loading, the
#                     data's token pyramids: ~160, about half an hour
# `--survivors` (e.g. `$(BIN)/python tests/mutation/run.py --runs --survivors`) reruns only what a group's last run
# did not kill, after new tests.
MUTATION_GROUPS = mutation-tokens mutation-infra mutation-core mutation-pruning mutation-measure mutation-scoring mutation-models mutation-plumbing mutation-runs mutation-surface mutation-figures mutation-cards
$(MUTATION_GROUPS): mutation-%: setup
	$(BIN)/python tests/mutation/run.py --$*
	$(BIN)/python tests/mutation/run.py --summary

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# tiny-t2i (the Infinity class, tiny) from scratch: BSQ VAE, transformer + text encoder, quality bars.
tiny-t2i: setup
	$(BIN)/python -m bench.recipes.tiny_t2i --out assets/tiny

# The shipped tiny-t2i files' recipe (--recipe gpu) on a GPU (369 s on one H200 shared with two other runs); its bars
# then measured on the CPU, where the tiny world's benches run. A GPU run does not repeat bit for bit.
tiny-t2i-gpu: setup
	$(BIN)/python -m bench.recipes.tiny_t2i --out assets/tiny --recipe gpu --device cuda --stages t2i
	$(BIN)/python -m bench.recipes.tiny_t2i --out assets/tiny --stages eval
