"""`torchfarm cache stats | ls | evict`: the caller's cache entries, through the coordinator.

    torchfarm cache stats [--target T] [--older-than AGE] [--json]
    torchfarm cache ls [--target T] [--older-than AGE] [--limit N] [--json]
    torchfarm cache evict KEY... | --all | --older-than AGE | --target T  [--dry-run] [--yes] [--json]

`stats` leads with the hit rate, in all, per target and per model (the model a graph's
label names). `evict` lists what it would remove first: `--dry-run` stops there, and a
bulk eviction (no KEY) asks before it acts (`--yes`: without asking; needed where stdin
is not a terminal). A KEY may be a prefix of 8+ hex digits, as the views print them.

Every call goes to the coordinator over gRPC with the tenant token (TORCHFARM_TOKEN),
which scopes it to the tenant's namespace (services/coordinator/cache.py); the CLI
never reads Redis. Evicting removes manifests; the shared, content-addressed blobs are
left to the cache Redis's LRU eviction, or to `torchfarm cache gc` (cli/gc.py,
an operator's command that reads the stores directly). AGE is "90s", "15m", "12h", "7d" or "2w".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable

import grpc
from google.protobuf.json_format import MessageToDict

from cli.confirm import confirm
from cli.errors import CliError
from cli.render import hit_rate, model_of
from torchfarm.tables import fmt_age, fmt_bytes, parse_age, table

EVERY = 2**31
"""A listing's limit for "every entry" (CacheQuery.limit is a uint32)."""
from torchfarm.v1 import farm_pb2, farm_pb2_grpc


def call(args: argparse.Namespace, what: str, rpc: Callable[[farm_pb2_grpc.CompileFarmStub, tuple], object]):
    """Runs one RPC against --remote (or TORCHFARM_REMOTE) as the SDK would talk to the
    farm: the tenant token (TORCHFARM_TOKEN), TLS for "grpcs://" or with
    TORCHFARM_TLS_CA_FILE. On failure prints `torchfarm WHAT: ...: CODE: detail` and
    returns None."""
    from sdk import settings as sdk_settings
    from sdk.client import make_channel  # torch-free
    from sdk.errors import ConfigError
    from torchfarm.trust.tokens import TokenError, namespace_of

    remote = args.remote or os.environ.get("TORCHFARM_REMOTE", "")
    if not remote:
        raise CliError("give --remote or set TORCHFARM_REMOTE", 2)
    try:
        settings = sdk_settings.load()
        if settings.token:
            namespace_of(settings.token)  # as the SDK checks it: a bad token is no farm's fault
        channel, metadata = make_channel(remote, settings, [])
    except TokenError as e:
        raise CliError(f"TORCHFARM_TOKEN: {e}", 2) from None
    except (ConfigError, ValueError) as e:
        raise CliError(str(e), 2) from None
    with channel:
        try:
            return rpc(farm_pb2_grpc.CompileFarmStub(channel), metadata)
        except grpc.RpcError as e:
            print(f"torchfarm {what}: {remote}: {e.code().name}: {e.details()}{_hint(e)}",
                  file=sys.stderr)
            return None


def _hint(e: grpc.RpcError) -> str:
    """What to do about a channel that never came up, where gRPC's detail shows why."""
    from sdk.client import TLS_TO_PLAIN

    if e.code() != grpc.StatusCode.UNAVAILABLE:
        return ""
    details = str(e.details()).lower()
    if "handshake" in details:
        return f" ({TLS_TO_PLAIN})"
    if "connection refused" in details:
        return " (nothing listens there: is the farm running? `torchfarm up` starts one on this machine)"
    return ""


def as_json(message) -> str:
    return json.dumps(
        MessageToDict(
            message, preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True, unquote_int64_if_possible=True,
        ),
        indent=2,
    )


def add_cache_parser(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Adds `torchfarm cache`; returns its subcommands, for `gc` (cli/gc.py,
    added by main.py: it reads Redis itself, which a client's install need not have)."""
    cache = sub.add_parser("cache", help="this tenant's cache entries: stats, ls, evict")
    csub = cache.add_subparsers(dest="cache_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--remote", default="", help="grpc://host:port (default TORCHFARM_REMOTE)")
        p.add_argument("--target", default="", help='only entries for this target, e.g. "cpu:avx512"')
        p.add_argument("--older-than", default="", metavar="AGE", help="only entries at least AGE old")
        p.add_argument("--json", action="store_true", help="every field, as JSON")
        p.add_argument("--timeout", type=float, default=30.0, help="seconds for the call")

    stats = csub.add_parser("stats", help="hit rate, entries, bytes and hits: in all, per target, per model")
    common(stats)
    stats.set_defaults(run=_stats)

    ls = csub.add_parser("ls", help="one line per entry, newest first")
    common(ls)
    ls.add_argument("--limit", type=int, default=50, help="most entries to show (default 50)")
    ls.set_defaults(run=_ls)

    evict = csub.add_parser("evict", help="remove entries; their keys compile again when next asked")
    common(evict)
    evict.add_argument("keys", nargs="*", metavar="KEY", help="keys, or prefixes of 8+ hex digits")
    evict.add_argument("--all", action="store_true", help="every entry (with the filters, if any)")
    evict.add_argument("--dry-run", action="store_true", help="list what would be evicted; evict nothing")
    evict.add_argument("-y", "--yes", action="store_true",
                       help="evict without asking (needed where stdin is not a terminal)")
    evict.set_defaults(run=_evict)
    return csub


def _query(args: argparse.Namespace, limit: int, keys: list[str] | None = None) -> farm_pb2.CacheQuery:
    try:
        older = parse_age(args.older_than) if args.older_than else 0.0
    except ValueError as e:
        raise CliError(f"--older-than: {e}", 2) from None
    return farm_pb2.CacheQuery(target=args.target, older_than_seconds=older, limit=limit, keys=keys or [])


def _list(args: argparse.Namespace, what: str, limit: int, keys: list[str] | None = None) -> farm_pb2.CacheListing | None:
    query = _query(args, limit, keys)
    return call(args, what, lambda stub, md: stub.ListArtifacts(query, timeout=args.timeout, metadata=md))


def stats_table(listing: farm_pb2.CacheListing) -> str:
    """The hit rate, entries, bytes and hits in all and per target, then per model."""
    rows = [[t.target, hit_rate(t.hits, t.entries), t.entries, fmt_bytes(t.bytes), t.hits]
            for t in listing.targets]
    rows.append(["all", hit_rate(listing.hits, listing.matched), listing.matched,
                 fmt_bytes(listing.bytes), listing.hits])
    numbers = ["HIT RATE", "ENTRIES", "BYTES", "HITS"]
    text = table(rows, ["TARGET", *numbers], right=numbers)
    if listing.entries:
        text += "\n\n" + models_table(listing.entries)
    return text


def models_table(entries: Iterable[farm_pb2.CacheEntry]) -> str:
    """Per model (from each entry's label), most hits first."""
    per: dict[str, list[int]] = {}
    for e in entries:
        counts = per.setdefault(model_of(e.label), [0, 0])
        counts[0] += 1
        counts[1] += e.hits
    rows = [[m, hit_rate(h, n), n, h] for m, (n, h) in sorted(per.items(), key=lambda kv: -kv[1][1])]
    numbers = ["HIT RATE", "ENTRIES", "HITS"]
    return table(rows, ["MODEL", *numbers], right=numbers)


def ls_table(listing: farm_pb2.CacheListing) -> str:
    rows = [
        [
            e.key[:12], e.label or "-", e.target, fmt_bytes(e.bytes), e.hits,
            fmt_age(e.age_seconds), fmt_age(e.last_hit_seconds) + " ago" if e.hits else "never",
        ]
        for e in listing.entries
    ]
    return table(rows, ["KEY", "LABEL", "TARGET", "BYTES", "HITS", "AGE", "LAST HIT"], right=["BYTES", "HITS"])


def _stats(args: argparse.Namespace) -> int:
    # Every entry, not totals only: the per-model rows are counted here from the labels.
    listing = _list(args, "cache stats", 0 if args.json else EVERY)
    if listing is None:
        return 1
    print(as_json(listing) if args.json else stats_table(listing))
    return 0


def _ls(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise CliError("--limit must not be negative", 2)
    listing = _list(args, "cache ls", args.limit)
    if listing is None:
        return 1
    if args.json:
        print(as_json(listing))
        return 0
    print(ls_table(listing) if listing.entries else "no cache entries match")
    if listing.matched > len(listing.entries):
        print(f"({len(listing.entries)} of {listing.matched} shown; --limit N shows more)")
    return 0


def _evict(args: argparse.Namespace) -> int:
    bulk = args.all or args.older_than or args.target
    if not (args.keys or bulk):
        raise CliError("give KEY..., --all, --older-than AGE or --target T", 2)
    # What would go, listed first: the user confirms these entries, and exactly these
    # (by full key) are evicted, not whatever matches the filters a moment later.
    listing = _list(args, "cache evict", EVERY, args.keys)
    if listing is None:
        return 1
    missing = [k for k in args.keys if not any(e.key.startswith(k) for e in listing.entries)]
    for k in missing:
        print(f"torchfarm cache evict: no entry {k}", file=sys.stderr)
    doomed = [e.key for e in listing.entries]
    size = f"{len(doomed)} entries ({fmt_bytes(listing.bytes)} named)"
    if args.dry_run or not doomed:
        if args.json:
            print(as_json(listing))
        else:
            if doomed:
                print(ls_table(listing))
            if args.dry_run:
                print(f"would evict {size}")
            elif not missing:  # each key that matched nothing was said above
                print("no cache entries match")
        return 1 if missing else 0
    if bulk:
        confirm(f"evict {size}", args.yes)
    request = farm_pb2.CacheEvict(keys=doomed)
    reply = call(args, "cache evict",
                 lambda stub, md: stub.EvictArtifacts(request, timeout=args.timeout, metadata=md))
    if reply is None:
        return 1
    if args.json:
        print(as_json(reply))
    else:
        for key in reply.evicted:
            print(f"evicted {key}")
        print(f"{len(reply.evicted)} entries evicted ({fmt_bytes(reply.bytes)} named; shared "
              "blobs are left to the cache's LRU eviction)")
    return 1 if missing else 0
