# varbench — every target installs into .venv first (make setup).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
WORLD   ?= tiny

.PHONY: setup test test-all lint table1 table2 table3 table4 table5 tables leaderboard figures tiny-models clean

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

table1 table2 table3 table4: setup
	$(BIN)/varbench table evar-$@ --world $(WORLD)

table5: setup
	@echo "evar-table5 (Core ML operator assignment and latency) is not in varbench yet: it lands with the latency bench." >&2; exit 2

tables: setup
	$(BIN)/varbench table all --world $(WORLD)

leaderboard figures: setup
	@echo "varbench $@ is not implemented yet (planned: rendered from records like the tables)." >&2; exit 2

tiny-models: setup
	$(BIN)/varbench train-tiny --out assets/tiny

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
