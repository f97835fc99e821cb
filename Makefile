# Three test environments, all set up by `make test` (and by CI through .ci/run):
#   latest: newest transformers 5.x + huggingface_hub 2.x. The newest release the registry has
#           is installed even when a dependency it declares is not to be had (5.25 declares
#           kernels>=0.19.1, which this registry lacked until December 2026): resolved with the
#           newest whose dependencies are met, then upgraded with --no-deps, as a user who
#           installs it gets. Tests that need kernels absent hide the package themselves.
#   memos:  MemoryOS (pins transformers<5) + accelerate: transformers 4.57.x, huggingface_hub 0.36.x
#   mlx:    latest's packages + MLX (mlx[cpu], mlx-lm): runs tests/mlx only (a few minutes)
# torch is pinned to 2.13.0, a local CPU wheel on our machines; any other request may pull GBs.
#
# Environments are built by tools/setup_env.py with uv (installed from PyPI into $(VENV)/tools;
# it resolves in seconds and links both environments from one download cache), handed pip's
# configuration; the build stops before installing anything if its plan holds a CUDA package.
# `make UV=` builds them with pip instead, as happens by itself when uv cannot be installed;
# `make UV=uv` uses a uv of your own. `make test` runs the suites two at a time, the short mlx
# one last (TEST_JOBS=1: one after the other), each logged to $(VENV)/NAME-tests.log and
# printed whole when it ends; each suite's pytest on TEST_WORKERS xdist workers (default 2);
# TEST_ARGS adds pytest arguments (e.g. TEST_ARGS=tests/kv).
PYTHON     ?= python3
VENV       ?= .venv
TORCH      := torch==2.13.0
PIP_Q      := --quiet --quiet --disable-pip-version-check
UV_VERSION := 0.13.9
UV_BOOT    := $(VENV)/tools/bin/uv
UV         ?= $(UV_BOOT)
TEST_JOBS  ?= 2
TEST_WORKERS ?= 2
TEST_ARGS  ?=
SETUP_ENV   = $(PYTHON) tools/setup_env.py --uv "$(UV)"
# Only the uv this Makefile installs is a prerequisite, through a stamp made by one attempt
# to install it (order-only: its age does not matter; a failed attempt is not retried).
UV_STAMP   := $(VENV)/tools/.attempted
UV_DEP     := $(if $(filter $(UV_BOOT),$(UV)),| $(UV_STAMP))

.PHONY: fresh-clone test test-latest test-memos test-mlx test-llamacpp setup demo bench hub-compat \
        memos-own-tests docs docs-serve clean

test: setup
	$(PYTHON) tools/run_suites.py --jobs $(TEST_JOBS) --logs $(VENV) --only mlx=tests/mlx \
	  latest=$(VENV)/latest/bin/python memos=$(VENV)/memos/bin/python \
	  mlx=$(VENV)/mlx/bin/python -- -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile \
	  $(TEST_ARGS)

# A copy of the checkout with no ../shared beside it (a user's clone) collects the suite, and
# the tests of MemOS's example cubes skip there with a reason (CI runs this before `make test`).
fresh-clone: $(VENV)/latest/.ready $(VENV)/memos/.ready
	$(PYTHON) tools/fresh_clone.py $(VENV)/latest/bin/python $(VENV)/memos/bin/python

test-latest: $(VENV)/latest/.ready
	$(VENV)/latest/bin/python -m pytest -q

test-memos: $(VENV)/memos/.ready
	$(VENV)/memos/bin/python -m pytest -q

test-mlx: $(VENV)/mlx/.ready
	$(VENV)/mlx/bin/python -m pytest -q tests/mlx

setup: $(VENV)/latest/.ready $(VENV)/memos/.ready $(VENV)/mlx/.ready

# If pip cannot install uv, say so and go on: setup_env.py then builds with pip.
$(UV_STAMP):
	@mkdir -p $(VENV)/tools && echo "setup: installing uv $(UV_VERSION) into $(VENV)/tools"
	@{ $(PYTHON) -m venv $(VENV)/tools && $(VENV)/tools/bin/python -m pip install $(PIP_Q) \
	  uv==$(UV_VERSION); } || echo "uv could not be installed: building the environments with pip"
	@touch $@

$(VENV)/latest/.ready: pyproject.toml tools/setup_env.py $(UV_DEP)
	$(SETUP_ENV) --no-deps "transformers>=5,<6" $(VENV)/latest $(TORCH) -e ".[test,sign]" \
	  "transformers>=5,<6" "huggingface_hub>=1"
	touch $@

$(VENV)/memos/.ready: pyproject.toml tools/setup_env.py $(UV_DEP)
	$(SETUP_ENV) $(VENV)/memos $(TORCH) -e ".[test,sign,memos]"
	touch $@

$(VENV)/mlx/.ready: pyproject.toml tools/setup_env.py $(UV_DEP)
	$(SETUP_ENV) $(VENV)/mlx $(TORCH) -e ".[test,sign,mlx]" "transformers>=5,<6" "huggingface_hub>=1"
	touch $@

# The docs site (docs/, mkdocs.yml) into site/, with --strict: a broken link or anchor, a page
# missing from the nav or a docstring the API reference cannot read fails the build (mkdocs.yml's
# validation settings make each a WARNING, and --strict fails on any). Not --quiet: it hides the
# warnings, and strict mode then counts none. Its own small environment: the pinned tools of
# docs/requirements.txt, no torch (docs/hooks.py puts this checkout on sys.path; the CLI
# reference imports cubepack.cli, which needs click and PyYAML only).
$(VENV)/docs/.ready: docs/requirements.txt tools/setup_env.py $(UV_DEP)
	$(SETUP_ENV) $(VENV)/docs -r docs/requirements.txt
	touch $@

docs: $(VENV)/docs/.ready
	NO_MKDOCS_2_WARNING=1 $(VENV)/docs/bin/mkdocs build --strict

# The site to read: built as `make docs` builds it and served at http://127.0.0.1:$(DOCS_PORT)/
# (rebuilt as a page changes). Opened as files, site/ has no search (the browser will not fetch
# its index from file://) and its folder links show folder listings: serve it.
DOCS_PORT ?= 8000
docs-serve: $(VENV)/docs/.ready
	NO_MKDOCS_2_WARNING=1 $(VENV)/docs/bin/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

demo: $(VENV)/memos/.ready
	$(VENV)/memos/bin/python -m cubepack.demo

bench: $(VENV)/latest/.ready $(VENV)/mlx/.ready
	$(VENV)/latest/bin/python bench/kv_load.py
	$(VENV)/latest/bin/python bench/verify.py
	$(VENV)/latest/bin/python bench/pull.py
	$(VENV)/latest/bin/python bench/identity.py
	$(VENV)/latest/bin/python bench/recompute.py
	$(VENV)/latest/bin/python bench/migrate.py
	$(VENV)/latest/bin/python bench/memos_use.py
	$(VENV)/mlx/bin/python bench/runtimes.py

# huggingface_hub's own tests against `cubepack hub serve` (downloads the installed version's
# sdist; needs pytest-mock, which its tests use). Not part of `make test`: it takes minutes.
hub-compat: $(VENV)/latest/.ready
	$(VENV)/latest/bin/python -m pip install $(PIP_Q) pytest-mock
	$(VENV)/latest/bin/python tools/hub_compat.py

# llama.cpp state files (tests/llamacpp): llama-cpp-python built from its sdist on CPU (the
# sdist also brings llama.cpp's own convert_hf_to_gguf.py and gguf-py, which the tests run).
# Not part of `make test`: the from-source build alone took 16.5 minutes on this 2-core machine
# (shared), most of CI's 20-minute budget for everything.
LLAMACPP_VERSION ?= 0.3.36
LLAMACPP_SRC     := $(VENV)/llamacpp-src
LLAMACPP_TREE    := $(LLAMACPP_SRC)/llama_cpp_python-$(LLAMACPP_VERSION)
LLAMACPP_SDIST   := $(LLAMACPP_TREE).tar.gz

$(LLAMACPP_SDIST):
	$(PYTHON) -m pip download $(PIP_Q) --no-deps --no-binary :all: -d $(LLAMACPP_SRC) \
	  llama-cpp-python==$(LLAMACPP_VERSION)

$(VENV)/llamacpp/.ready: pyproject.toml $(LLAMACPP_SDIST)
	tar -xzf $(LLAMACPP_SDIST) -C $(LLAMACPP_SRC)
	$(PYTHON) -m venv $(VENV)/llamacpp
	$(VENV)/llamacpp/bin/pip install $(PIP_Q) $(TORCH) "transformers==4.57.6" sentencepiece \
	  "protobuf>=4.21,<5" -e ".[test]" $(LLAMACPP_TREE)/vendor/llama.cpp/gguf-py
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF" MAKEFLAGS=-j2 nice -n 10 \
	  $(VENV)/llamacpp/bin/pip install $(PIP_Q) $(LLAMACPP_SDIST)
	touch $@

test-llamacpp: $(VENV)/llamacpp/.ready
	CUBEPACK_LLAMACPP_CONVERT=$(LLAMACPP_TREE)/vendor/llama.cpp/convert_hf_to_gguf.py \
	  $(VENV)/llamacpp/bin/python -m pytest -q tests/llamacpp

# MemOS's own tests (cube, activation memory, HF LLM, MOSCore, scheduler) plain and with the
# hook installed; needs a MemOS checkout or git mirror: make memos-own-tests MEMOS=path
memos-own-tests: $(VENV)/memos/.ready
	@test -n "$(MEMOS)" || { echo "make memos-own-tests needs MEMOS=<a MemOS checkout>" \
	  "(git clone https://github.com/MemTensor/MemOS)"; exit 2; }
	$(VENV)/memos/bin/pip install $(PIP_Q) pika
	$(VENV)/memos/bin/python tools/memos_own_tests.py $(MEMOS)

clean:
	rm -rf $(VENV) demo-out site
