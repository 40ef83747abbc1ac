"""`torchfarm cache gc [--dry-run] [--grace AGE] [--max-age AGE] [--max-bytes N]`: the
farm's unreferenced blobs go, and with the bounds (per store, TORCHFARM_BLOB_MAX_AGE and
TORCHFARM_BLOB_MAX_BYTES) the oldest ones past them.

An operator's command, farm-wide (every namespace), so it talks to the cache Redis and
the blob store directly, configured as the coordinator is: TORCHFARM_CACHE_URL,
TORCHFARM_BLOB_URL and TORCHFARM_REDIS_PREFIX (or --cache-url, --blob-url).
"""

from __future__ import annotations

import argparse
import json
import os

from torchfarm.tables import fmt_bytes, parse_age


def add_gc_parser(csub: argparse._SubParsersAction) -> None:
    gc = csub.add_parser("gc", help="(operators) delete blobs that no manifest or record names")
    gc.add_argument("--dry-run", action="store_true", help="show what would go; delete nothing")
    gc.add_argument("--grace", default="1d", metavar="AGE",
                    help="only blobs unused for at least AGE (default 1d)")
    gc.add_argument("--max-age", default=os.environ.get("TORCHFARM_BLOB_MAX_AGE", "0"), metavar="AGE",
                    help="also blobs older than AGE, named or not (default 0: no bound)")
    gc.add_argument("--max-bytes", type=int, default=int(os.environ.get("TORCHFARM_BLOB_MAX_BYTES", "0")),
                    help="then the oldest blobs until the rest fit in this many bytes (0: no bound)")
    gc.add_argument("--cache-url", default=os.environ.get("TORCHFARM_CACHE_URL", "redis://127.0.0.1:6379/1"))
    gc.add_argument("--state-url", default=os.environ.get("TORCHFARM_STATE_URL", ""),
                    help="the state Redis, whose plans name blobs too (default: the cache's)")
    gc.add_argument("--blob-url", default=os.environ.get("TORCHFARM_BLOB_URL", ""))
    gc.add_argument("--prefix", default=os.environ.get("TORCHFARM_REDIS_PREFIX", "tf"))
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(run=_gc)


def _gc(args: argparse.Namespace) -> int:
    from torchfarm.blobgc import collect
    from torchfarm.store import Store

    store = Store.from_url(args.cache_url, args.prefix, args.blob_url, args.state_url)
    garbage = collect(store, parse_age(args.grace), dry_run=args.dry_run,
                      max_age_s=parse_age(args.max_age), max_bytes=args.max_bytes)
    total = sum(b.size for b in garbage)
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "blobs": [b.digest for b in garbage], "bytes": total}))
        return 0
    for b in garbage:
        print(f"{b.digest[:19]}  {fmt_bytes(b.size):>10}  unused {b.age_s:.0f}s")
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(garbage)} unreferenced blobs, {fmt_bytes(total)}")
    return 0
