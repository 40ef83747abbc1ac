"""The `torchfarm` command.

    torchfarm up [--grpc-port P] [--redis-port R] [--workers N] [--pin-cores] [--concurrency C]
                 [--metrics-port M]   coordinator /metrics on M, worker i on M+1+i
                 [--auth TENANT]      require tokens; print one for TENANT
                 [--data-dir DIR]     keep Redis's data and the logs (cli/up.py)
    torchfarm keygen DIR [--key-id ID]   an Ed25519 signing key for workers, and its pin
    torchfarm token TENANT [--namespace NS] [--days D] [--tokens-file F]
                                 a new token (printed once); its hash for the tokens file
    torchfarm status [--remote grpc://host:port] [--json]
                                 workers per target, queues, in-flight and recent jobs
    torchfarm cache stats|ls|evict [--json] ...   this tenant's cache entries (cli/cache.py)
    torchfarm cache gc [--dry-run] [--grace AGE]   (operators) delete blobs nothing names (cli/gc.py)
    torchfarm explain KEY [--json]   why KEY missed: the closest artifact and the key
                                 component that differs (cli/explain.py)
    torchfarm warm [--steps N] SCRIPT.py [args]   run a script to fill the farm's cache
                                 (cli/warm.py, sdk/warm_mode.py)
    torchfarm kernel compile FILE.py::name --target cuda:sm_90 --signature ... [-o out]
                                 one Triton kernel compiled by the farm (cli/targets.py)
    torchfarm coordinator        run the coordinator (settings from TORCHFARM_*)
    torchfarm worker [--targets local,cuda:sm_90,rocm:gfx942]
                                 run a Celery worker for those targets (docs/targets.md)
    torchfarm --version

Every operational error is one line on stderr and a non-zero exit status
(cli/failures.py); --traceback adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from cli.cache import EVERY, add_cache_parser, as_json, call, stats_table
from cli.errors import CliError
from cli.explain import add_explain_parser
from cli.failures import reported
from cli.gc import add_gc_parser
from cli.parser import Parser, count
from cli.render import hit_rate
from cli.targets import add_kernel_parser, builds_table, targets_table
from cli.up import add_up_parser
from cli.warm import add_warm_parser
from torchfarm import tables
from torchfarm.v1 import farm_pb2


def _keygen(args: argparse.Namespace) -> int:
    from pathlib import Path

    from torchfarm.trust.signing import Signer

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    signer = Signer.generate()
    if args.key_id:
        signer = Signer(signer.private, args.key_id)
    # A directory's first key is signing-key.pem; a later one (a rotation's step 1) is
    # made beside it, named by its id: the live key is never replaced (docs/security.md).
    key = out / "signing-key.pem"
    if key.exists():
        key = out / f"signing-key-{signer.key_id.replace(':', '-')}.pem"
    try:
        signer.save(key)
    except FileExistsError:
        raise CliError(f"{key} exists: a signing key is never overwritten; give another --key-id", 2) from None
    pins = out / "trusted-keys.json"
    existing = json.loads(pins.read_text()) if pins.exists() else {}
    pins.write_text(json.dumps({**existing, **signer.trusted_entry()}, indent=2) + "\n")
    print(f"workers:  TORCHFARM_SIGNING_KEY_FILE={key}"
          + (f" TORCHFARM_SIGNING_KEY_ID={args.key_id}" if args.key_id else ""))
    print(f"clients:  TORCHFARM_TRUSTED_KEYS_FILE={pins}   (key id {signer.key_id}; "
          "earlier keys in the file stay pinned until you remove them)")
    return 0


def _token(args: argparse.Namespace) -> int:
    from torchfarm.trust import tokens

    tok = tokens.new_token(args.namespace or args.tenant)
    expires = tokens.default_expiry() if args.days is None else time.time() + args.days * 86400
    entry = tokens.table_entry(tok, args.tenant, expires=expires if args.days != 0 else None)
    print(f"token (give it to {args.tenant}; it is shown once): {tok}")
    if args.tokens_file:
        tokens.add_to_file(args.tokens_file, entry)
        print(f"its hash is in {args.tokens_file}; a running coordinator picks it up within a second")
    else:
        print("add to the coordinator's TORCHFARM_TOKENS_FILE (or pass --tokens-file):")
        print(json.dumps(entry))
    return 0


_fmt_bytes = tables.fmt_bytes
_table = tables.table


def _status(args: argparse.Namespace) -> int:
    address = (args.remote or os.environ.get("TORCHFARM_REMOTE", "")).removeprefix("grpc://")
    if not address:
        raise CliError("give --remote or set TORCHFARM_REMOTE", 2)
    # As the SDK connects: the token, and TLS for grpcs:// or TORCHFARM_TLS_CA_FILE.
    st = call(args, "status", lambda stub, md: stub.GetFarmStatus(
        farm_pb2.FarmStatusRequest(), timeout=args.timeout, metadata=md
    ))
    if st is None:
        return 1
    if args.json:
        print(as_json(st))  # every field, numbers as JSON numbers
        return 0
    # This tenant's cache entries, for the hit rates (the status carries none).
    listing = call(args, "status", lambda stub, md: stub.ListArtifacts(
        farm_pb2.CacheQuery(limit=EVERY), timeout=args.timeout, metadata=md
    ))
    if listing is None:
        return 1
    print(render_status(st, address, listing))
    return 0


def render_status(st: farm_pb2.FarmStatus, address: str, listing: farm_pb2.CacheListing | None = None) -> str:
    """`torchfarm status` as text: one section per function below, blank lines between;
    with the tenant's cache `listing`, its hit rates lead."""
    head = (f"coordinator {st.coordinator_version} at {address}\n"
            f"cache: {st.artifacts} artifacts, Redis using {_fmt_bytes(st.cache_bytes)}")
    if listing is not None:
        head += f", hit rate {hit_rate(listing.hits, listing.matched)} ({listing.hits} hits)"
    sections = [
        head,
        stats_table(listing) if listing is not None and listing.matched else "",
        workers_table(st),
        queues_table(st),
        in_flight_table(st),
        recent_jobs_table(st),
    ]
    return "\n\n".join(s for s in sections if s)


def workers_table(st: farm_pb2.FarmStatus) -> str:
    """Workers per target (how many, which, most recent heartbeat), then each worker."""
    if not st.workers:
        return "no live workers"
    seen = {w.name: w.last_seen_seconds for w in st.workers}
    rows = []
    for target, graph, kernel in targets_table(st):
        names = {n for n in (graph + "," + kernel).split(",") if n and n != "-"}
        rows.append([target, graph, kernel, len(names), f"{min(seen[n] for n in names):.1f}s ago"])
    per_target = _table(rows, ["TARGET", "GRAPH WORKERS", "KERNEL WORKERS", "WORKERS", "LAST SEEN"])
    per_build = builds_table(st)
    if per_build:  # a client reaches only the workers of its own build
        per_target += "\n\n" + _table(per_build, ["TARGET", "BUILD", "GRAPH WORKERS"])
    workers = _table(
        [[w.name, w.queue, f"{w.last_seen_seconds:.1f}s ago", w.build, _sandbox(w.sandbox)] for w in st.workers],
        ["WORKER", "QUEUES", "SEEN", "BUILD", "SANDBOX"],
    )
    return per_target + "\n\n" + workers


def _sandbox(mode: str) -> str:
    """A worker's sandbox mode, marked when it is degraded (anything but bwrap)."""
    return mode if mode in ("bwrap", "") else f"{mode} (DEGRADED)"


def queues_table(st: farm_pb2.FarmStatus) -> str:
    return _table([[q.name, str(q.queued), str(q.running)] for q in st.queues], ["QUEUE", "QUEUED", "RUNNING"])


def _kernels(j: farm_pb2.JobStatus) -> str:
    if not j.kernels_total:
        return "-"
    return f"{j.kernels_done}/{j.kernels_total}" + (f" ({j.kernels_hit} hit)" if j.kernels_hit else "")


def in_flight_table(st: farm_pb2.FarmStatus) -> str:
    """This tenant's queued and running jobs: label, stage, tries, age, kernel progress."""
    if not st.in_flight:
        return "no jobs in flight"
    info = {i.key: i for i in st.job_info}
    empty = farm_pb2.FarmStatus.JobInfo()
    rows = [
        [
            j.key[:12], info.get(j.key, empty).label or "-", farm_pb2.JobState.Name(j.state),
            j.stage or "-", str(j.attempts), tables.fmt_age(info.get(j.key, empty).age_seconds),
            _kernels(j),
        ]
        for j in st.in_flight
    ]
    return "IN FLIGHT\n" + _table(rows, ["KEY", "LABEL", "STATE", "STAGE", "TRIES", "AGE", "KERNELS"])


def recent_jobs_table(st: farm_pb2.FarmStatus) -> str:
    """This tenant's latest jobs, newest first."""
    if not st.recent_jobs:
        return ""
    return "RECENT JOBS\n" + _table(
            [
                [
                    j.key[:12],
                    farm_pb2.JobState.Name(j.state),
                    j.stage,
                    str(j.attempts),
                    tables.stage_timings(j.timings),
                    j.error_code,
                ]
                for j in st.recent_jobs
            ],
            ["KEY", "STATE", "STAGE", "TRIES", "TIMINGS", "ERROR"],
        )


def _coordinator(args: argparse.Namespace) -> int:
    from services.coordinator.server import main

    main()
    return 0


def _worker(args: argparse.Namespace) -> int:
    # The worker derives its queues from its targets (workers/serving.py); -Q only adds.
    if args.targets:
        os.environ["TORCHFARM_TARGETS"] = args.targets
    if args.lower_without_gpu:
        os.environ["TORCHFARM_LOWER_WITHOUT_GPU"] = "1"
    if args.known_targets:
        return _known_targets()
    extra = ["-Q", ",".join(args.queues)] if args.queues else []
    if args.queues:
        os.environ["TORCHFARM_QUEUES"] = ",".join(args.queues)
    cmd = [
        sys.executable, "-m", "celery", "-A", "workers.app", "worker", *extra,
        "--concurrency", str(args.concurrency), "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]
    os.execv(sys.executable, cmd)


def _known_targets() -> int:
    """Prints the graph targets this worker would serve, each with its build, as the
    coordinator's TORCHFARM_KNOWN_TARGETS names them ("cuda:sm_90@b3f9c21"): run in a
    pool's image on one of its nodes, it is what a pool that has never run is named by."""
    from torchfarm.settings import from_env
    from workers.serving import plan_for
    from workers.settings import WorkerSettings

    plan = plan_for(from_env(WorkerSettings))
    if not plan.graph:
        raise CliError("this worker would lower no graphs (it takes Triton kernel jobs only): it has no known targets")
    print(",".join(f"{t}@b{plan.build}" for t in plan.graph))
    return 0


def build_parser() -> Parser:
    parser = Parser(prog="torchfarm", description="A remote compile farm for torch.compile")
    parser.add_argument("--version", action="version", version=f"torchfarm {_version()}")
    parser.add_argument("--traceback", action="store_true",
                        help="on an error, show the traceback too (for a bug report)")
    sub = parser.add_subparsers(dest="command", required=True)
    add_up_parser(sub)

    keygen = sub.add_parser("keygen", help="an Ed25519 artifact signing key and its public pin")
    keygen.add_argument("dir", help="writes signing-key.pem (0600) and trusted-keys.json here")
    keygen.add_argument("--key-id", default="", help="default: derived from the public key")
    keygen.set_defaults(run=_keygen)

    token = sub.add_parser("token", help="a new tenant token and its tokens-file entry")
    token.add_argument("tenant")
    token.add_argument("--namespace", default="", help="cache namespace (default: the tenant's own)")
    token.add_argument(
        "--days", type=float, default=None,
        help="days until the token expires (default 90; 0: never)",
    )
    token.add_argument(
        "--tokens-file", default="", help="add its hash to this tokens file (atomically, mode 0600)"
    )
    token.set_defaults(run=_token)

    status = sub.add_parser("status", help="workers, queues, cache and recent jobs")
    status.add_argument("--remote", default="", help="grpc://host:port (default TORCHFARM_REMOTE)")
    status.add_argument("--json", action="store_true", help="every field, as JSON")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds for each call")
    status.set_defaults(run=_status)

    coord = sub.add_parser("coordinator", help="run the gRPC coordinator")
    coord.set_defaults(run=_coordinator)

    worker = sub.add_parser("worker", help="run a compile worker")
    worker.add_argument(
        "--targets", default="",
        help='targets to serve, e.g. "local" (default), "cpu", "cuda:sm_90,rocm:gfx942"; a '
        "GPU this machine lacks gets Triton kernel jobs only",
    )
    worker.add_argument(
        "--lower-without-gpu", action="store_true",
        help="experimental: also lower graphs for one CUDA target this machine lacks",
    )
    worker.add_argument("-Q", "--queues", type=lambda s: s.split(","), default=[],
                        help="extra Celery queues (normally none: they follow from the targets)")
    worker.add_argument("--concurrency", type=count(1), default=1, help="jobs run at once (pool processes)")
    worker.add_argument(
        "--known-targets", action="store_true",
        help="print the targets and build this worker would serve, as TORCHFARM_KNOWN_TARGETS "
        "names them, and exit",
    )
    worker.set_defaults(run=_worker)

    add_kernel_parser(sub)
    add_gc_parser(add_cache_parser(sub))
    add_warm_parser(sub)
    add_explain_parser(sub)

    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchfarm")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with reported(args.prog, args.traceback) as outcome:
        outcome.status = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler
    return outcome.status


if __name__ == "__main__":
    sys.exit(main())
