"""The `torchfarm` command.

    torchfarm up [--grpc-port P] [--redis-port R] [--workers N] [--pin-cores]
    torchfarm status [--remote grpc://host:port] [--json]
    torchfarm coordinator        run the coordinator (settings from TORCHFARM_*)
    torchfarm worker [-Q cpu]    run a Celery worker (settings from TORCHFARM_*)
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

from torchfarm.v1 import farm_pb2, farm_pb2_grpc


def _up(args: argparse.Namespace) -> int:
    from torchfarm.stack import LocalStack

    stack = LocalStack(
        workers=args.workers,
        grpc_port=args.grpc_port,
        redis_port=args.redis_port,
        metrics_port=args.metrics_port,
        pin_cores=args.pin_cores,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stack.start()
    try:
        print(f"torchfarm: farm ready at {stack.address} (logs in {stack.workdir})", flush=True)
        stop.wait()
    finally:
        print("torchfarm: stopping", flush=True)
        stack.stop()
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
    with grpc.insecure_channel(address) as channel:
        try:
            st = farm_pb2_grpc.CompileFarmStub(channel).GetFarmStatus(
                farm_pb2.FarmStatusRequest(), timeout=args.timeout
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
    os.environ["TORCHFARM_QUEUES"] = ",".join(args.queues)
    cmd = [
        sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-Q", ",".join(args.queues),
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
    up.set_defaults(run=_up)

    status = sub.add_parser("status", help="workers, queues, cache and recent jobs")
    status.add_argument("--remote", default="", help="grpc://host:port (default TORCHFARM_REMOTE)")
    status.add_argument("--json", action="store_true")
    status.add_argument("--timeout", type=float, default=5.0)
    status.set_defaults(run=_status)

    coord = sub.add_parser("coordinator", help="run the gRPC coordinator")
    coord.set_defaults(run=_coordinator)

    worker = sub.add_parser("worker", help="run a compile worker")
    worker.add_argument("-Q", "--queues", type=lambda s: s.split(","), default=["cpu"])
    worker.add_argument("--concurrency", type=int, default=1)
    worker.set_defaults(run=_worker)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
