# Two test environments, both set up by `make test` (and by CI through .ci/run):
#   latest: newest transformers 5.x + huggingface_hub 2.x
#   memos:  MemoryOS (pins transformers<5) + accelerate: transformers 4.57.x, huggingface_hub 0.36.x
# torch is pinned to 2.13.0, a local CPU wheel on our machines; any other request may pull GBs.
PYTHON ?= python3
VENV   ?= .venv
TORCH  := torch==2.13.0
PIP_Q  := --quiet --disable-pip-version-check

.PHONY: test test-latest test-memos setup demo bench hub-compat memos-own-tests clean

test: setup
	CUBEPACK_OTHER_PYTHON=$(abspath $(VENV))/memos/bin/python $(VENV)/latest/bin/python -m pytest -q -p no:cacheprovider
	CUBEPACK_OTHER_PYTHON=$(abspath $(VENV))/latest/bin/python $(VENV)/memos/bin/python -m pytest -q -p no:cacheprovider

test-latest: $(VENV)/latest/.ready
	$(VENV)/latest/bin/python -m pytest -q

test-memos: $(VENV)/memos/.ready
	$(VENV)/memos/bin/python -m pytest -q

setup: $(VENV)/latest/.ready $(VENV)/memos/.ready

$(VENV)/latest/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)/latest
	$(VENV)/latest/bin/pip install $(PIP_Q) $(TORCH)
	$(VENV)/latest/bin/pip install $(PIP_Q) $(TORCH) -e ".[test,sign]" "transformers>=5,<6" "huggingface_hub>=1"
	touch $@

$(VENV)/memos/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)/memos
	$(VENV)/memos/bin/pip install $(PIP_Q) $(TORCH)
	$(VENV)/memos/bin/pip install $(PIP_Q) $(TORCH) -e ".[test,sign,memos]"
	touch $@

demo: $(VENV)/memos/.ready
	$(VENV)/memos/bin/python -m cubepack.demo

bench: $(VENV)/latest/.ready
	$(VENV)/latest/bin/python bench/kv_load.py
	$(VENV)/latest/bin/python bench/verify.py
	$(VENV)/latest/bin/python bench/pull.py
	$(VENV)/latest/bin/python bench/identity.py
	$(VENV)/latest/bin/python bench/recompute.py
	$(VENV)/latest/bin/python bench/memos_use.py

# huggingface_hub's own tests against `cubepack hub serve` (downloads the installed version's
# sdist; needs pytest-mock, which its tests use). Not part of `make test`: it takes minutes.
hub-compat: $(VENV)/latest/.ready
	$(VENV)/latest/bin/pip install $(PIP_Q) pytest-mock
	$(VENV)/latest/bin/python tools/hub_compat.py

# MemOS's own tests (cube, activation memory, HF LLM, MOSCore, scheduler) plain and with the
# hook installed; needs a MemOS checkout or git mirror: make memos-own-tests MEMOS=path
memos-own-tests: $(VENV)/memos/.ready
	$(VENV)/memos/bin/pip install $(PIP_Q) pika
	$(VENV)/memos/bin/python tools/memos_own_tests.py $(MEMOS)

clean:
	rm -rf $(VENV) demo-out
