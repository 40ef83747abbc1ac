"""`torchfarm cache gc [--dry-run] [--yes] [--grace AGE] [--max-age AGE] [--max-bytes N]`: the
farm's unreferenced blobs go, and with the bounds (per store, TORCHFARM_BLOB_MAX_AGE and
TORCHFARM_BLOB_MAX_BYTES) the oldest ones past them.

An operator's command, farm-wide (every namespace), so it talks to the cache Redis and
the blob store directly, configured as the coordinator is: TORCHFARM_CACHE_URL,
TORCHFARM_BLOB_URL and TORCHFARM_REDIS_PREFIX (or --cache-url, --blob-url). It lists
what would go and asks before it deletes (--yes: without asking).
"""

from __future__ import annotations

import argparse
import json
import os

from cli.confirm import confirm
from cli.errors import CliError
from cli.parser import count
from torchfarm.tables import fmt_bytes, parse_age


def add_gc_parser(csub: argparse._SubParsersAction) -> None:
    gc = csub.add_parser("gc", help="(operators) delete blobs that no manifest or record names")
    gc.add_argument("--dry-run", action="store_true", help="show what would go; delete nothing")
    gc.add_argument("-y", "--yes", action="store_true",
                    help="delete without asking (needed where stdin is not a terminal)")
    gc.add_argument("--grace", default="1d", metavar="AGE",
                    help="only blobs unused for at least AGE (default 1d)")
    gc.add_argument("--max-age", default=os.environ.get("TORCHFARM_BLOB_MAX_AGE", "0"), metavar="AGE",
                    help="also blobs older than AGE, named or not (default 0: no bound)")
    gc.add_argument("--max-bytes", type=count(0), default=int(os.environ.get("TORCHFARM_BLOB_MAX_BYTES", "0")),
                    help="then the oldest blobs until the rest fit in this many bytes (0: no bound)")
    gc.add_argument("--cache-url", default=os.environ.get("TORCHFARM_CACHE_URL", "redis://127.0.0.1:6379/1"),
                    help="the cache Redis (TORCHFARM_CACHE_URL)")
    gc.add_argument("--state-url", default=os.environ.get("TORCHFARM_STATE_URL", ""),
                    help="the state Redis, whose plans name blobs too (default: the cache's)")
    gc.add_argument("--blob-url", default=os.environ.get("TORCHFARM_BLOB_URL", ""),
                    help="where blobs are, if not in the cache Redis (TORCHFARM_BLOB_URL)")
    gc.add_argument("--prefix", default=os.environ.get("TORCHFARM_REDIS_PREFIX", "tf"),
                    help="the farm's Redis key prefix (TORCHFARM_REDIS_PREFIX)")
    gc.add_argument("--json", action="store_true", help="the blobs and bytes, as JSON")
    gc.set_defaults(run=_gc)


def _gc(args: argparse.Namespace) -> int:
    try:
        import redis
    except ImportError:
        raise CliError(
            "cache gc reads the farm's Redis itself (an operator's command, unlike cache ls and "
            "evict): run it where the farm runs, or pip install 'torchfarm[all]' and give --cache-url", 1,
        ) from None

    from torchfarm.storage.blobgc import collect
    from torchfarm.storage.store import Store

    try:
        grace, max_age = parse_age(args.grace), parse_age(args.max_age)
    except ValueError as e:
        raise CliError(str(e), 2) from None
    store = Store.from_url(args.cache_url, args.prefix, args.blob_url, args.state_url)

    def run(dry_run: bool) -> list:
        return collect(store, grace, dry_run=dry_run, max_age_s=max_age, max_bytes=args.max_bytes)

    try:
        garbage = run(True)
        if not args.dry_run and garbage:
            confirm(f"delete {len(garbage)} unreferenced blobs, "
                    f"{fmt_bytes(sum(b.size for b in garbage))}", args.yes)
            # Collected again: what is unreferenced now (a manifest written since the
            # listing names its blobs again, and they stay).
            garbage = run(False)
    except redis.ConnectionError as e:
        raise CliError(f"cannot reach the cache Redis at {args.cache_url} ({e}); give "
                       "--cache-url or set TORCHFARM_CACHE_URL") from None
    total = sum(b.size for b in garbage)
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "blobs": [b.digest for b in garbage], "bytes": total}))
        return 0
    for b in garbage:
        print(f"{b.digest[:19]}  {fmt_bytes(b.size):>10}  unused {b.age_s:.0f}s")
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(garbage)} unreferenced blobs, {fmt_bytes(total)}")
    return 0
