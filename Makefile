# torchfarm: `make demo` runs the end-to-end demo; `make test` runs the tests.
PY := .venv/bin/python

.PHONY: setup demo test test-fast test-faults proto proto-check bench bench-scaling bench-steps bench-load fuzz clean

setup:
	@./scripts/setup.sh

demo: setup
	$(PY) examples/demo.py

test: setup proto-check
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not integration"

proto: setup
	./scripts/gen_proto.sh

# Regenerates the committed protobuf code and fails if anything changed.
proto-check: setup
	@./scripts/gen_proto.sh && git diff --exit-code --stat -- torchfarm/v1 \
	  || (echo "generated protobuf code is stale: run 'make proto' and commit" >&2; exit 1)

bench: setup
	$(PY) bench/compile_bench.py

# Cold farm compile of the GPT with 1 and 2 pinned workers, stage shares, 8/32-worker estimate.
bench-scaling: setup
	$(PY) bench/scaling.py $(SCALING_ARGS)

# Per-step time of the first 20 GPT training steps: farm wait=False, farm blocking, local.
bench-steps: setup
	$(PY) bench/steps.py $(STEPS_ARGS)

# N client processes against a local farm with tokens and signed artifacts (bench/load.py).
bench-load: setup
	$(PY) bench/load.py $(LOAD_ARGS)
	$(PY) bench/fetch_load.py $(FETCH_LOAD_ARGS)

# Workers, Redis and the coordinator killed on purpose; figures printed at the end.
test-faults: setup
	$(PY) -m pytest -q -p no:cacheprovider -s tests/faults

# Coverage-guided fuzzing of the graph validator and decoder (atheris), FUZZ_SECONDS long.
FUZZ_SECONDS ?= 300
fuzz: setup
	$(PY) tests/fuzz/atheris_graph.py -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 .fuzz-corpus

clean:
	rm -rf .venv build *.egg-info .pytest_cache
