"""`torchfarm explain KEY`: why a key missed the farm's cache (torchfarm/storage/explain.py).

    torchfarm explain KEY [--remote grpc://host:port] [--json]

KEY may be a prefix of 8+ hex digits, as every view prints keys (12 digits): it is
matched against this tenant's cache entries and the farm's recent and in-flight jobs,
and one that matches more than one key is an error naming them.

Prints the reason (the first key component that differs from the closest artifact of
the same graph or model: torch_build, triton, cpu_isa, gpu_arch, compiler, options,
input_metadata, graph; or evicted, or new), the closest artifact's key, and the detail,
which for the graph names the first node that differs. Exit status 1 when the farm has
no explanation for the key (it never missed, or the record expired).
"""

from __future__ import annotations

import argparse
import re

from cli.cache import EVERY, as_json, call
from cli.errors import CliError
from torchfarm.v1 import farm_pb2

MIN_PREFIX = 8
"""Shortest key prefix taken, as `cache evict` takes (services/coordinator/cache.py)."""

_KEY = re.compile(r"[0-9a-f]{64}")
_PREFIX = re.compile(r"[0-9a-f]+")


def _explain(args: argparse.Namespace) -> int:
    key = resolve_key(args, args.key.strip().lower())
    if key is None:
        return 1
    found = call(args, "explain", lambda stub, md: stub.ExplainMiss(
        farm_pb2.JobRef(key=key), timeout=args.timeout, metadata=md
    ))
    if found is None:
        return 1
    if args.json:
        print(as_json(found))
        return 0
    print(render(key, found))
    return 0


def resolve_key(args: argparse.Namespace, given: str) -> str | None:
    """The full key `given` names: itself, or the one key it is a prefix of among the
    tenant's cache entries and the farm's recent and in-flight jobs. CliError for a
    prefix too short, unknown or ambiguous; None when a call failed (and said so)."""
    if _KEY.fullmatch(given):
        return given
    if len(given) < MIN_PREFIX or not _PREFIX.fullmatch(given):
        raise CliError(f"{given!r} is not a key or a prefix of {MIN_PREFIX}+ hex digits", 2)
    known = candidates(args)
    if known is None:
        return None
    matches = sorted(k for k in known if k.startswith(given))
    if not matches:
        raise CliError(f"no cache entry or recent job has a key starting with {given}; "
                       "give the full key (the SDK logs it)")
    if len(matches) > 1:
        raise CliError(f"key prefix {given} is ambiguous: it matches {', '.join(m[:16] for m in matches[:5])}"
                       f"{' ...' if len(matches) > 5 else ''}; give more digits", 2)
    return matches[0]


def candidates(args: argparse.Namespace) -> set[str] | None:
    """Every full key the farm shows this tenant: cache entries, recent and running jobs."""
    listing = call(args, "explain", lambda stub, md: stub.ListArtifacts(
        farm_pb2.CacheQuery(limit=EVERY), timeout=args.timeout, metadata=md
    ))
    if listing is None:  # said why; the status call would only say it again
        return None
    status = call(args, "explain", lambda stub, md: stub.GetFarmStatus(
        farm_pb2.FarmStatusRequest(), timeout=args.timeout, metadata=md
    ))
    if status is None:
        return None
    return ({e.key for e in listing.entries} | {j.key for j in status.recent_jobs}
            | {j.key for j in status.in_flight})


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
    p.add_argument("key", help="the key, or a prefix of 8+ hex digits (as the views print it)")
    p.add_argument("--remote", default="", help="grpc://host:port (default TORCHFARM_REMOTE)")
    p.add_argument("--json", action="store_true", help="every field, as JSON")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for each call")
    p.set_defaults(run=_explain)
