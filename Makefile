# Every target does its own set-up: `make demo` and `make test` work on a fresh machine.
VENV     ?= .venv
PY       := $(VENV)/bin/python
PARAMEDIC := $(VENV)/bin/paramedic
DATA     ?= $(or $(PARAMEDIC_DATA),$(HOME)/.cache/paramedic/data)
DEMO     ?= demo-run
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup blast data demo test lint bench conformance fuzz clean

setup: $(VENV)/.installed blast

# ncbi-blast+ from Debian when BLAST+ is missing, and a C compiler for the shims that read BLAST+'s
# preliminary hit list (needed by --strategy fragments) and serve BLAST+ runs (idempotent).
blast:
	@command -v blastp >/dev/null && command -v makeblastdb >/dev/null || \
	  { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq ncbi-blast+ >/dev/null; }
	@command -v cc >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq gcc >/dev/null; }
	@blastp -version | head -1

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[mpich,dev]'
	touch $@

data:
	PARAMEDIC_DATA=$(DATA) bash scripts/fetch-data.sh

# The main job on real data: 500 UniProt queries against 20,000 proteins, 4 fragments, all local cores.
demo: setup data
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(PARAMEDIC) format --in $(DATA)/mmseqs2/DB.fasta --dbtype prot --fragments 4 --out $(DEMO)/db/uniprot
	$(PARAMEDIC) search blastp -query $(DATA)/mmseqs2/QUERY.fasta -db $(DEMO)/db/uniprot \
	  -out $(DEMO)/hits.txt -outfmt 0 -evalue 1e-5
	@echo "output: $(DEMO)/hits.txt   run record: $(DEMO)/hits.txt.run.json"

test: setup data
	PARAMEDIC_DATA=$(DATA) $(VENV)/bin/pytest -q

# The whole conformance matrix (tests/conformance): paramedic against BLAST+ on the unsplit database, cell
# by cell; writes docs/CONFORMANCE.md. About an hour on 2 cores; `make test` runs a slice of it.
conformance: setup data
	PARAMEDIC_DATA=$(DATA) $(PY) -m tests.conformance --out docs/CONFORMANCE.md

lint: setup
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

bench: setup data
	PARAMEDIC_DATA=$(DATA) $(PY) bench/throughput.py --rounds 3

# Fuzzing of every decoder of untrusted bytes at the storage site (frames, request fields, inbox files, job
# setups, chunks; then mutated sessions against a real `paramedic serve`): bounded, 4-8 minutes here.
fuzz: setup
	@$(PY) -c 'import atheris' 2>/dev/null || $(VENV)/bin/pip install -q -e '.[mpich,dev,fuzz]'
	$(PY) bench/fuzz.py

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache
