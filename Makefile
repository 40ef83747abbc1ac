# torchfarm: `make demo` runs the end-to-end demo; `make test` runs the tests.
PY := .venv/bin/python
# Python writes its bytecode caches even where the environment says not to (container
# images set PYTHONDONTWRITEBYTECODE=1): without them every test process compiles the
# farm's modules again, and pytest rewrites and compiles every test module again in each
# of its processes (collection took 13 s instead of 7).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo lint test test-fast test-higher-order test-models test-distributed bench-ranks test-failover test-precompiled test-deploy test-second-build test-oldest-build test-faults proto proto-check bench bench-scaling bench-steps bench-load bench-sandbox bench-split bench-gpu fuzz coverage-report clean

setup:
	@./scripts/setup.sh

demo: setup
	$(PY) examples/demo.py

# ruff, then mypy on the files and with the strictness pyproject.toml's [tool.mypy] gives.
lint: setup
	$(PY) -m ruff check . && $(PY) -m mypy

# One pytest-xdist process per core and one more. Run serially, the suite kept 0.77 of
# 2 cores busy (its tests wait on their farms' processes); 3 processes kept both over
# 86 % busy, 36 min serial against 19. Each process takes whole files, so the stack a
# module or class shares starts once.
TEST_PROCS ?= $(shell echo $$(( $$(nproc) + 1 )))

test: setup lint proto-check
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_PROCS) --dist loadfile --durations=25 -m "not models_full and not failover and not distributed and not precompiled_full and not higher_order_full"

# A compile in flight through a Redis Sentinel failover (tests/integration/test_sentinel.py).
# Precompiled frames: a changed model, a tampered package, wait=False (tests/integration/test_precompiled.py).
test-precompiled: setup
	$(PY) -m pytest -q -p no:cacheprovider -m precompiled_full tests/integration/test_precompiled.py

test-failover: setup
	$(PY) -m pytest -q -p no:cacheprovider -m failover

# Distributed training through the farm: gloo ranks under torchrun (tests/integration/test_distributed.py).
test-distributed: setup
	$(PY) -m pytest -q -p no:cacheprovider tests/integration/test_distributed.py

# 4 gloo ranks, cold farm against every rank compiling locally (bench/ranks.py).
bench-ranks: setup
	$(PY) bench/ranks.py $(RANKS_ARGS)

# The whole real-model suite (tests/integration/test_real_models.py).
test-models: setup
	$(PY) -m pytest -q -p no:cacheprovider -m models

# Every higher-order op through the farm (tests/integration/test_higher_order.py);
# `make test` runs checkpointing and autograd.Function.
test-higher-order: setup
	$(PY) -m pytest -q -p no:cacheprovider tests/integration/test_higher_order.py

# The unit tests, one pytest-xdist process per core.
test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -n auto --durations=25 -m "not slow and not integration"

# Unit tests and one end-to-end compile on torch 2.12, in a venv made once outside the
# checkout (2.7 GB of CUDA wheels the first time; scripts/test_second_build.sh). In .ci/run.
test-second-build:
	./scripts/test_second_build.sh

# The same on the oldest supported build, torch 2.11 with its Triton 3.6, on Python 3.12
# where there is one: the GPU machine's (docs/targets.md). Its own cached venv; in .ci/run.
test-oldest-build:
	TORCHFARM_SECOND_BUILD_TORCH="torch==2.11.*" \
	TORCHFARM_SECOND_BUILD_VENV="$$HOME/.cache/torchfarm/venv-torch-2.11" \
	PYTHON="$$(for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 python3; do \
	  "$$p" -c '' 2>/dev/null && { command -v "$$p"; break; }; done)" \
	  ./scripts/test_second_build.sh

proto: setup
	./scripts/gen_proto.sh

# Regenerates the committed protobuf code and fails if anything changed.
# Stale, changed or new untracked generated files all show in `git status --porcelain`.
proto-check: setup
	@./scripts/gen_proto.sh && test -z "$$(git status --porcelain -- torchfarm/v1)" \
	  || (git status --short -- torchfarm/v1; echo "generated protobuf code is stale: run 'make proto' and commit" >&2; exit 1)

bench: setup
	$(PY) bench/compile_bench.py

# Cold farm compile of the GPT with 1 and 2 pinned workers, stage shares, 8/32-worker estimate.
bench-scaling: setup
	$(PY) bench/scaling.py $(SCALING_ARGS)

# Per-step time of the first 20 GPT training steps: farm wait=False, farm blocking, local.
bench-steps: setup
	$(PY) bench/steps.py $(STEPS_ARGS)

# On a GPU machine: the first training step eager, local cold and warm, PyTorch's Redis
# remote cache, the farm cold and hit, max-autotune cold and hit, with compiler counts
# (bench/gpu_bench.py; docs/gpu.md). GPU_BENCH_ARGS="--device cpu ..." runs it here.
bench-gpu: setup
	$(PY) bench/gpu_bench.py $(GPU_BENCH_ARGS)

# A graph split at a call the farm refuses, against compiling it whole here (bench/split_bench.py).
bench-split: setup
	$(PY) bench/split_bench.py $(SPLIT_ARGS)

# A cold compile with the compile sandbox off and on, side by side (bench/sandbox_cost.py).
bench-sandbox: setup
	$(PY) bench/sandbox_cost.py $(SANDBOX_ARGS)

# N client processes against a local farm with tokens and signed artifacts (bench/load.py).
bench-load: setup
	$(PY) bench/load.py --compare $(LOAD_ARGS)
	$(PY) bench/fetch_load.py $(FETCH_LOAD_ARGS)

# The real-model suite's transformers models on a local farm: docs/model-coverage.md.
coverage-report: setup
	HF_HUB_OFFLINE=1 $(PY) scripts/model_coverage.py $(COVERAGE_ARGS)

# The compose deployment built with podman and run end to end: clients in containers of
# their own train through it with token, TLS and pinned key (scripts/test_deploy.sh;
# needs root; about 15 min on a clean machine, less with the base images cached).
test-deploy:
	./scripts/test_deploy.sh

# Workers, Redis and the coordinator killed on purpose; figures printed at the end.
test-faults: setup
	$(PY) -m pytest -q -p no:cacheprovider -s tests/faults

# Coverage-guided fuzzing of the graph validator and decoder (atheris), FUZZ_SECONDS long.
FUZZ_SECONDS ?= 300
fuzz: setup
	$(PY) tests/fuzz/atheris_graph.py -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 .fuzz-corpus

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
