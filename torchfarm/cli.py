"""The `torchfarm` command.

    torchfarm up [--grpc-port P] [--redis-port R] [--workers N] [--pin-cores]
                 [--metrics-port M]   coordinator /metrics on M, worker i on M+1+i
                 [--auth TENANT]      require tokens; print one for TENANT
    torchfarm keygen DIR [--key-id ID]   an Ed25519 signing key for workers, and its pin
    torchfarm token TENANT [--namespace NS]   a new token, and its line for the tokens file
    torchfarm status [--remote grpc://host:port] [--json]
    torchfarm coordinator        run the coordinator (settings from TORCHFARM_*)
    torchfarm worker [--targets local,cuda:sm_90,rocm:gfx942]
                                 run a Celery worker for those targets (docs/targets.md)
    torchfarm kernel compile FILE.py::name --target cuda:sm_90 --signature ... [-o out]
                                 one Triton kernel compiled by the farm (cli_targets.py)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

import grpc
from google.protobuf.json_format import MessageToDict

from torchfarm.cli_targets import add_kernel_parser, targets_table
from torchfarm.v1 import farm_pb2, farm_pb2_grpc


def _up(args: argparse.Namespace) -> int:
    from torchfarm.stack import LocalStack

    stack = LocalStack(
        workers=args.workers,
        grpc_port=args.grpc_port,
        redis_port=args.redis_port,
        metrics_port=args.metrics_port,
        pin_cores=args.pin_cores,
        tenants=(args.auth,) if args.auth else (),
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stack.start()
    try:
        print(f"torchfarm: farm ready at {stack.address} (logs in {stack.workdir})", flush=True)
        # The workers sign every artifact with a key made for this run; clients pin it.
        print("torchfarm: for SDK processes on this machine:", flush=True)
        for name, value in stack.client_env(args.auth).items():
            print(f"  export {name}={value}", flush=True)
        if not args.auth:
            print("torchfarm: authentication is off (loopback only); --auth TENANT turns it on", flush=True)
        if args.metrics_port:
            ports = [args.metrics_port] + [stack.worker_metrics_port(i) for i in range(args.workers)]
            print(f"torchfarm: /metrics on ports {', '.join(map(str, ports))}", flush=True)
        stop.wait()
    finally:
        print("torchfarm: stopping", flush=True)
        stack.stop()
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from pathlib import Path

    from torchfarm.signing import Signer

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    signer = Signer.generate()
    if args.key_id:
        signer = Signer(signer.private, args.key_id)
    signer.save(out / "signing-key.pem")
    pins = out / "trusted-keys.json"
    existing = json.loads(pins.read_text()) if pins.exists() else {}
    pins.write_text(json.dumps({**existing, **signer.trusted_entry()}, indent=2) + "\n")
    print(f"workers:  TORCHFARM_SIGNING_KEY_FILE={out / 'signing-key.pem'}"
          + (f" TORCHFARM_SIGNING_KEY_ID={args.key_id}" if args.key_id else ""))
    print(f"clients:  TORCHFARM_TRUSTED_KEYS_FILE={pins}   (key id {signer.key_id}; "
          "earlier keys in the file stay pinned until you remove them)")
    return 0


def _token(args: argparse.Namespace) -> int:
    from torchfarm import tokens

    tok = tokens.new_token(args.namespace or args.tenant)
    print(f"token (give it to {args.tenant}; it is shown once): {tok}")
    print("add to the coordinator's TORCHFARM_TOKENS_FILE:")
    print(json.dumps(tokens.table_entry(tok, args.tenant)))
    return 0


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    address = (args.remote or os.environ.get("TORCHFARM_REMOTE", "")).removeprefix("grpc://")
    if not address:
        print("torchfarm status: give --remote or set TORCHFARM_REMOTE", file=sys.stderr)
        return 2
    token = os.environ.get("TORCHFARM_TOKEN", "")
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(address) as channel:
        try:
            st = farm_pb2_grpc.CompileFarmStub(channel).GetFarmStatus(
                farm_pb2.FarmStatusRequest(), timeout=args.timeout, metadata=metadata
            )
        except grpc.RpcError as e:
            print(f"torchfarm status: {address}: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(MessageToDict(st, preserving_proto_field_name=True), indent=2))
        return 0
    print(f"coordinator {st.coordinator_version} at {address}")
    print(f"cache: {st.artifacts} artifacts, Redis using {_fmt_bytes(st.cache_bytes)}\n")
    print(_table(
        [[w.name, w.queue, f"{w.last_seen_seconds:.1f}s ago", w.build] for w in st.workers],
        ["WORKER", "QUEUES", "SEEN", "BUILD"],
    ) if st.workers else "no live workers")
    if st.workers:
        print()
        print(_table(targets_table(st), ["TARGET", "GRAPH WORKERS", "KERNEL WORKERS"]))
    print()
    print(_table([[q.name, str(q.queued), str(q.running)] for q in st.queues], ["QUEUE", "QUEUED", "RUNNING"]))
    if st.recent_jobs:
        print()
        print(_table(
            [
                [
                    j.key[:12],
                    farm_pb2.JobState.Name(j.state),
                    j.stage,
                    str(j.attempts),
                    " ".join(f"{t.stage}={t.seconds:.2f}s" for t in j.timings),
                    j.error_code,
                ]
                for j in st.recent_jobs
            ],
            ["KEY", "STATE", "STAGE", "TRIES", "TIMINGS", "ERROR"],
        ))
    return 0


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
    extra = ["-Q", ",".join(args.queues)] if args.queues else []
    if args.queues:
        os.environ["TORCHFARM_QUEUES"] = ",".join(args.queues)
    cmd = [
        sys.executable, "-m", "celery", "-A", "workers.app", "worker", *extra,
        "--concurrency", str(args.concurrency), "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]
    os.execv(sys.executable, cmd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchfarm", description="A remote compile farm for torch.compile")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run redis-server, the coordinator and CPU workers on loopback")
    up.add_argument("--grpc-port", type=int, default=50051)
    up.add_argument("--redis-port", type=int, default=0, help="0 picks a free port")
    up.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics; 0 is off")
    up.add_argument("--workers", type=int, default=1)
    up.add_argument("--pin-cores", action="store_true", help="pin worker i to core i (taskset)")
    up.add_argument("--auth", metavar="TENANT", default="", help="require tokens; make one for TENANT")
    up.set_defaults(run=_up)

    keygen = sub.add_parser("keygen", help="an Ed25519 artifact signing key and its public pin")
    keygen.add_argument("dir", help="writes signing-key.pem (0600) and trusted-keys.json here")
    keygen.add_argument("--key-id", default="", help="default: derived from the public key")
    keygen.set_defaults(run=_keygen)

    token = sub.add_parser("token", help="a new tenant token and its tokens-file entry")
    token.add_argument("tenant")
    token.add_argument("--namespace", default="", help="cache namespace (default: the tenant's own)")
    token.set_defaults(run=_token)

    status = sub.add_parser("status", help="workers, queues, cache and recent jobs")
    status.add_argument("--remote", default="", help="grpc://host:port (default TORCHFARM_REMOTE)")
    status.add_argument("--json", action="store_true")
    status.add_argument("--timeout", type=float, default=5.0)
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
    worker.add_argument("--concurrency", type=int, default=1)
    worker.set_defaults(run=_worker)

    add_kernel_parser(sub)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
