"""`torchfarm explain KEY`: why a key missed the farm's cache (torchfarm/explain.py).

    torchfarm explain KEY [--remote grpc://host:port] [--json]

Prints the reason (the first key component that differs from the closest artifact of
the same graph or model: torch_build, triton, cpu_isa, gpu_arch, compiler, options,
input_metadata, graph; or evicted, or new), the closest artifact's key, and the detail,
which for the graph names the first node that differs. Exit status 1 when the farm has
no explanation for the key (it never missed, or the record expired).
"""

from __future__ import annotations

import argparse

from torchfarm.cli.cache import as_json, call
from torchfarm.v1 import farm_pb2


def _explain(args: argparse.Namespace) -> int:
    found = call(args, "explain", lambda stub, md: stub.ExplainMiss(
        farm_pb2.JobRef(key=args.key), timeout=args.timeout, metadata=md
    ))
    if found is None:
        return 1
    if args.json:
        print(as_json(found))
        return 0
    print(render(args.key, found))
    return 0


def render(key: str, e: farm_pb2.MissExplanation) -> str:
    lines = [f"key {key[:12]} missed: {e.reason}"]
    if e.closest_key:
        lines.append(f"closest artifact: {e.closest_key}")
    if e.differs:
        lines.append(f"differs in: {', '.join(e.differs)}")
    lines.append(e.detail)
    return "\n".join(lines)


def add_explain_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="why a key missed: the closest artifact and what differs")
    p.add_argument("key", help="the full key (the SDK's log line shows its first 12 digits)")
    p.add_argument("--remote", default="", help="grpc://host:port (default TORCHFARM_REMOTE)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=10.0)
    p.set_defaults(run=_explain)
