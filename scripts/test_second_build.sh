#!/usr/bin/env bash
# The unit tests and one end-to-end compile on a second torch build (issue 20, item 2):
# `make test-second-build`, the last step of .ci/run; never run by the test suite: the
# first run downloads torch 2.12 from the package index, a CUDA build of several GB.
#
# The venv is made once, at $TORCHFARM_SECOND_BUILD_VENV (default
# ~/.cache/torchfarm/venv-torch-2.12), and reused while its torch matches:
#   TORCHFARM_SECOND_BUILD_TORCH   pip requirement for torch    (default "torch==2.12.*")
#   TORCHFARM_SECOND_BUILD_INDEX   pip --index-url for torch    (default: pip's own, PyPI;
#                                  https://download.pytorch.org/whl/cpu is far smaller)
#   PYTHON                         interpreter the venv is made from (3.11 or 3.12)
# `make test-oldest-build` sets all three for the GPU machine's build: torch 2.11 on
# Python 3.12 where a python3.12 is in PATH (venv-torch-2.11).
# `scripts/test_second_build.sh --venv-only` makes the venv and runs no test.
# Torch brings the Triton it was built with; the farm's other dependencies come from
# pyproject.toml, less its torch and triton pins.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${TORCHFARM_SECOND_BUILD_VENV:-$HOME/.cache/torchfarm/venv-torch-2.12}"
TORCH_SPEC="${TORCHFARM_SECOND_BUILD_TORCH:-torch==2.12.*}"
INDEX="${TORCHFARM_SECOND_BUILD_INDEX:-}"
PYTHON="${PYTHON:-python3}"
WANT_MINOR="$(echo "$TORCH_SPEC" | sed -n 's/^torch[=<>~!]*\([0-9]*\.[0-9]*\).*/\1/p')"
WANT_PY="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# The venv holds the wanted torch minor version on the wanted Python.
have_build() {
  [ -f "$VENV/.torchfarm-complete" ] && "$VENV/bin/python" - "$WANT_MINOR" "$WANT_PY" <<'PY'
import sys
import torch
python = "%d.%d" % sys.version_info[:2]
sys.exit(0 if torch.__version__.startswith(sys.argv[1] + ".") and python == sys.argv[2] else 1)
PY
}

# The project's dependencies, installed again when pyproject.toml or constraints.txt
# changed since (the digest of both is kept in the venv).
deps_digest() { cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1; }
install_deps() {
  # The project's dependencies and dev extras (its own extras expanded), less the pins
  # torch decides; the other pins of constraints.txt hold, as in the main venv.
  "$PYTHON" scripts/extra_requirements.py dev | grep -v -E '^(torch|triton)\b' > "$VENV/farm-requirements.txt"
  grep -v -i -E '^(torch|triton)\b' constraints.txt > "$VENV/farm-constraints.txt"
  "$VENV/bin/python" -m pip install -q -c "$VENV/farm-constraints.txt" -r "$VENV/farm-requirements.txt"
  deps_digest > "$VENV/.torchfarm-deps"
}

if ! have_build; then
  echo "making $VENV with $TORCH_SPEC (once; a large download)" >&2
  start=$(date +%s)
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  free_gb=$(df -BG --output=avail "$(dirname "$VENV")" | tail -1 | tr -dc 0-9)
  [ "$free_gb" -ge 8 ] || { echo "$free_gb GB free for $VENV; the venv needs 6" >&2; exit 1; }
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  if [ -n "$INDEX" ]; then
    "$VENV/bin/python" -m pip install -q --index-url "$INDEX" "$TORCH_SPEC"
  else
    "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
  fi
  install_deps
  "$VENV/bin/python" -c 'import torch' || { echo "the venv's torch does not import" >&2; exit 1; }
  touch "$VENV/.torchfarm-complete"
  have_build || { echo "the venv's torch is not $TORCH_SPEC on Python $WANT_PY" >&2; exit 1; }
  echo "made $VENV in $(( $(date +%s) - start )) s" >&2
fi

[ "$(cat "$VENV/.torchfarm-deps" 2>/dev/null)" = "$(deps_digest)" ] || install_deps
[ "${1:-}" = "--venv-only" ] && exit 0  # make (or check) the cached venv, run nothing

"$VENV/bin/python" -c 'import sys, torch; print("second build: torch", torch.__version__, "python", sys.version.split()[0])'
export PYTHONPATH="$PWD" TORCHFARM_WARMUP=0
# The internals the farm relies on (tests/unit/test_internals.py) come first: a moved
# one is named there before any compile fails on it.
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/unit/test_internals.py
# Two processes (pytest-xdist): the unit tests share nothing, and the job stays short.
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -n 2 -m "not slow and not integration" tests/unit tests/targets
# One end-to-end compile through the local stack: a farm miss, then a hit in a fresh process.
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/integration/test_end_to_end.py \
  -k test_fresh_process_with_empty_cache_gets_a_hit_and_compiles_nothing
