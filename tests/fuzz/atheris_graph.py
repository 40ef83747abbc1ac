"""Coverage-guided fuzzing of the graph validator and decoder with atheris.

    .venv/bin/pip install atheris        # or: pip install -e '.[fuzz]'
    .venv/bin/python tests/fuzz/atheris_graph.py -max_total_time=60 [-runs=N] [corpus_dir]

Each input is parsed as a `CompileRequest` (as the coordinator's gRPC layer would),
then goes through what the coordinator runs on it (option allow-list, graph validation,
key) and, when valid, through the worker's `decode_graph` (torch). Anything but a
protobuf DecodeError or a GraphError is a finding: atheris stops and prints the input.
Only torchfarm's and the worker's modules are instrumented; torch is not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports(include=["torchfarm", "torchfarm.fx.decode"]):
    from torchfarm.fx.decode import decode_graph
    from torchfarm.graph import graphcheck
    from torchfarm.graph.graph_errors import GraphError
    from torchfarm.v1 import farm_pb2
    from torchfarm.wire import keys, options

from google.protobuf.message import DecodeError  # noqa: E402

from tests.requests import relu_request  # noqa: E402

LIMITS = graphcheck.GraphLimits()
DECODE = "--no-decode" not in sys.argv


def one_input(data: bytes) -> None:
    request = farm_pb2.CompileRequest()
    try:
        request.ParseFromString(data)
    except DecodeError:
        return
    try:
        options.check_options(request.options.mode, [(o.name, o.json_value) for o in request.options.inductor])
        graphcheck.validate_graph(request.graph, LIMITS)
    except GraphError:
        return
    keys.compute_key(request, "fuzz")
    if DECODE:
        try:
            decode_graph(request.graph)
        except GraphError:
            return


def main() -> None:
    argv = [a for a in sys.argv if a != "--no-decode"]
    corpus = [a for a in argv[1:] if not a.startswith("-")]
    if corpus:
        seed_dir = Path(corpus[0])
        seed_dir.mkdir(parents=True, exist_ok=True)
        (seed_dir / "relu").write_bytes(relu_request().SerializeToString())
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
