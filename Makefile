# torchfarm: `make demo` runs the end-to-end demo; `make test` runs the tests.
PY := .venv/bin/python

.PHONY: setup demo test test-fast proto proto-check bench clean

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

clean:
	rm -rf .venv build *.egg-info .pytest_cache
