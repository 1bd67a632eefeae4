# Every target does its own set-up: `make demo` and `make test` work on a fresh machine.
VENV     ?= .venv
PY       := $(VENV)/bin/python
PARAMEDIC := $(VENV)/bin/paramedic
DATA     ?= $(or $(PARAMEDIC_DATA),$(HOME)/.cache/paramedic/data)
DEMO     ?= demo-run
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup blast slurm chromium mpi-trace otf2-view gromacs data demo test test-unit test-integration coverage lint bench conformance faults fuzz clean

# The package's bytecode written once: with PYTHONDONTWRITEBYTECODE set (as on this machine) every command
# would compile its modules again (0.05 s of CPU per command, in every trace shipped and every search).
setup: $(VENV)/.installed blast
	@$(PY) -m compileall -q src >/dev/null

# ncbi-blast+ from Debian when BLAST+ is missing, and a C compiler for the shims that read BLAST+'s
# preliminary hit list (needed by --strategy fragments) and serve BLAST+ runs (idempotent).
blast:
	@command -v blastp >/dev/null && command -v makeblastdb >/dev/null || \
	  { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq ncbi-blast+ >/dev/null; }
	@command -v cc >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq gcc >/dev/null; }
	@blastp -version | head -1

# Slurm and munge from Debian when missing, for tests/integration/test_slurm.py: it runs
# examples/slurm/search.sbatch under a slurmctld, a slurmd and a munged of its own (idempotent).
slurm:
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && \
	  command -v munged >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; }
	@slurmctld -V

# Debian's headless Chromium when missing, for tests/integration/test_report_page.py: it opens the report
# page (paramedic report), fails on a JavaScript error or an empty chart, and takes a screenshot (idempotent).
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
	@chromium --version

# Open MPI (headers and mpiexec), LAMMPS and its examples from Debian when missing: `paramedic trace` builds
# its PMPI library against Open MPI (and MPICH: the mpich wheel's, and Debian's, whose programs the tests
# trace too; Open MPI stays Debian's default mpicc/mpiexec), and the trace tests and
# bench/traces.py trace LAMMPS, a real MPI program nobody here wrote; gfortran for the test of a Fortran
# MPI program (idempotent).
mpi-trace:
	@command -v mpicc.openmpi >/dev/null && command -v mpiexec.openmpi >/dev/null && command -v lmp >/dev/null && \
	  command -v gfortran >/dev/null && command -v mpicc.mpich >/dev/null && \
	  [ -d /usr/share/lammps/examples ] || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends libopenmpi-dev openmpi-bin lammps lammps-examples gfortran \
	  mpich libmpich-dev >/dev/null; }
	@mpiexec.openmpi --version | head -1

# What opens an OTF2 archive of `paramedic convert --otf2`, from Debian when missing: otf2-tools (otf2-print,
# which tests/integration/test_trace_otf2.py reads every event with), ViTE, and Xvfb with ImageMagick's
# `import` for the test's screenshot of ViTE's window (idempotent). The bindings that write OTF2 are the
# venv's (extra `otf2`, installed by `make setup`).
otf2-view:
	@command -v otf2-print >/dev/null && command -v vite >/dev/null && command -v Xvfb >/dev/null && \
	  command -v xvfb-run >/dev/null && command -v import >/dev/null || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends otf2-tools vite \
	  xvfb xauth imagemagick >/dev/null; }
	@otf2-print --version

# Debian's GROMACS (gmx_mpi, Open MPI), the paper's Figure 5 program: bench/traces.py and bench/trace_wan.py
# trace it when present (78 MB of packages; not needed by the tests).
gromacs: mpi-trace
	@command -v gmx_mpi >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends gromacs >/dev/null; }
	@gmx_mpi --version 2>/dev/null | grep -m1 "GROMACS version"

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[mpich,dev,otf2]'
	touch $@

data:
	PARAMEDIC_DATA=$(DATA) bash scripts/fetch-data.sh

# What paramedic is, on real data in about two minutes: the fragments engine checked byte for byte against
# BLAST+, ParaMEDIC across two sites on 127.0.0.1 (metadata over TLS), the report page (scripts/demo.py).
# Writes only under $(DEMO)/ and leaves nothing running.
demo: setup mpi-trace data
	$(PY) scripts/demo.py --data $(DATA)/mmseqs2 --out $(DEMO)

# Two passes (issue 25: `make test` is to stay well under 20 minutes on 2 cores). The tests alone use
# 1.2-1.3 of the 2 cores (waits, single-threaded BLAST+ references, Python), so two pytest workers share
# them (pytest-xdist): 15 minutes instead of 21. Then the tests marked `alone`, one at a time: they look
# at machine-wide state (all of /dev/shm, /tmp's MPICH files) before and after, which another test's job
# would change. The 30 slowest tests are listed at the end of each pass.
test: setup slurm chromium mpi-trace otf2-view data
	PARAMEDIC_DATA=$(DATA) $(VENV)/bin/pytest -q -n 2 --dist worksteal -m "not alone" \
	  --durations=30 --durations-min=10
	PARAMEDIC_DATA=$(DATA) $(VENV)/bin/pytest -q -m alone --durations=10 --durations-min=10

# Pure logic, no BLAST+ runs, no MPI: seconds.
test-unit: setup
	$(VENV)/bin/pytest -q tests/unit

# Real BLAST+, real mpiexec ranks, real TLS sockets and files, a real Slurm (most of `make test`'s time).
test-integration: setup slurm chromium mpi-trace otf2-view data
	PARAMEDIC_DATA=$(DATA) $(VENV)/bin/pytest -q tests/integration

# The MPI runners tested inside real ranks, as mpi4py tests itself (tests/mpi): the test process is every
# rank, under mpiexec -n 2, 3 and 4, with line and branch coverage of those modules (about a minute). Each
# rank gets a pytest root of its own (tests/mpi/conftest.py): sharing one, their clean-ups collided.
MPI_RUNNERS := src/paramedic/engine/runtime/launch.py,src/paramedic/engine/runtime/on_ranks.py,src/paramedic/engine/runtime/ranks.py,\
  src/paramedic/engine/runtime/partitions.py,src/paramedic/engine/runtime/roles.py,src/paramedic/engine/rank/mpiio.py,\
  src/paramedic/engine/core/runner.py
.PHONY: test-mpi
test-mpi: setup data
	rm -f .coverage.mpi .coverage.mpi.*
	base=$$(mktemp -d) && for n in 2 3 4; do PARAMEDIC_MPI_BASETEMP=$$base COVERAGE_FILE=$(CURDIR)/.coverage.mpi \
	  PARAMEDIC_DATA=$(DATA) $(VENV)/bin/mpiexec -n $$n $(PY) -m coverage run -m pytest -q -p no:cacheprovider \
	  tests/mpi || { rm -rf $$base; exit 1; }; done; rm -rf $$base
	COVERAGE_FILE=$(CURDIR)/.coverage.mpi $(VENV)/bin/coverage combine -q
	COVERAGE_FILE=$(CURDIR)/.coverage.mpi $(VENV)/bin/coverage report --include='$(subst $(eval) ,,$(MPI_RUNNERS))'

# Line and branch coverage of src/paramedic over the whole suite (or TESTS=tests/unit ...), every Python
# process included: the CLI subprocesses, mpiexec's ranks and the storage-site daemons start coverage
# from its .pth hook ([tool.coverage.run] patch = subprocess) and write .coverage.* files next to this
# Makefile (COVERAGE_FILE), which pytest-cov combines. Report in the terminal and in htmlcov/.
TESTS ?= tests
coverage: setup slurm chromium data
	rm -rf .coverage .coverage.* htmlcov
	COVERAGE_FILE=$(CURDIR)/.coverage PARAMEDIC_DATA=$(DATA) \
	  $(VENV)/bin/pytest -q --cov --cov-report=term:skip-covered --cov-report=html $(TESTS)

# The whole conformance matrix (tests/conformance): paramedic against BLAST+ on the unsplit database, cell
# by cell; writes docs/CONFORMANCE.md. About an hour on 2 cores; `make test` runs a slice of it.
conformance: setup data
	PARAMEDIC_DATA=$(DATA) $(PY) -m tests.conformance --out docs/CONFORMANCE.md

# Style, format, types (mypy, [tool.mypy]) and the package layers ([tool.importlinter] in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

bench: setup data
	PARAMEDIC_DATA=$(DATA) $(PY) bench/throughput.py --rounds 3

# Fault soak (issue 11): ~10 minutes of kill -9 of compute clients and of the storage site, cut links
# (Toxiproxy, from bench/wan/setup.sh when Go is there) and a nearly full disk, then the checks; writes
# bench/out/faults.json. Root mounts the site's small ext4 root and each job's /dev/shm.
faults: setup data
	@[ -x "$(or $(PARAMEDIC_TOOLS),$(HOME)/.cache/paramedic/tools)/toxiproxy-server" ] || ! command -v go >/dev/null || \
	  bash bench/wan/setup.sh || echo "faults: no Toxiproxy: the soak cuts links with the tests' CuttingProxy"
	PARAMEDIC_DATA=$(DATA) $(PY) bench/faults.py $(FAULTS_ARGS)

# Fuzzing of every decoder of untrusted bytes at the storage site (frames, request fields, inbox files, job
# setups, chunks; then mutated sessions against a real `paramedic serve`): bounded, 4-8 minutes here.
fuzz: setup
	@$(PY) -c 'import atheris' 2>/dev/null || $(VENV)/bin/pip install -q -e '.[mpich,dev,fuzz]'
	$(PY) bench/fuzz.py

# A cluster in a box (issue 26, tests/support/cluster.py): 3 emulated nodes (NODES=N), each a network
# namespace on the bridge pmcbr0 with its own hostname, IP and node-local scratch tmpfs, one slurmd each;
# slurmctld and munged beside them. Left running: `export SLURM_CONF=/var/tmp/pmc-cluster/slurm.conf`, then
# sbatch from here; `make cluster-down` removes it all (so does the next `make cluster`). Root only.
.PHONY: cluster cluster-down test-cluster cluster-tools
NODES ?= 3
# ip and tc (iproute2), unshare and nsenter (util-linux) from Debian when missing (idempotent).
cluster-tools:
	@command -v ip >/dev/null && command -v tc >/dev/null && command -v nsenter >/dev/null && \
	  command -v unshare >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends iproute2 util-linux >/dev/null; }

cluster: setup slurm cluster-tools
	$(PY) -m tests.support.cluster up --nodes $(NODES)

cluster-down: setup
	$(PY) -m tests.support.cluster down

# The output strategies' write times on the emulated cluster with the shared output directory behind a
# shaped link (an sshfs mount on every node of a storage host's directory; bench/cluster_output.py, a few
# minutes). openssh-server and sshfs from Debian when missing.
.PHONY: bench-cluster-output
bench-cluster-output: setup slurm cluster-tools data
	@command -v sshfs >/dev/null && test -x /usr/sbin/sshd || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	  openssh-server sshfs >/dev/null; }
	PARAMEDIC_DATA=$(DATA) $(PY) -m bench.cluster_output

# The engine across three emulated nodes under real Slurm (tests/cluster, 2.5-3.5 minutes): a cluster of
# its own (prefix pmt), brought up and removed by the tests.
test-cluster: setup slurm cluster-tools data
	PARAMEDIC_CLUSTER_TESTS=1 PARAMEDIC_DATA=$(DATA) $(VENV)/bin/pytest -q tests/cluster

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .mypy_cache .coverage .coverage.* htmlcov
