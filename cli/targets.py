"""`torchfarm kernel compile` and the per-target view of `torchfarm status`. Free of torch.

    torchfarm kernel compile FILE.py::kernel --target cuda:sm_90 \\
        --signature '*fp32,*fp32,*fp32,i32,constexpr' --constexpr BLOCK=1024 \\
        [--num-warps 4] [--num-stages 3] [-o out.cubin] [--asm out.ptx] [--metadata out.json]

The file is read as text and sent; nothing in it is imported or run, here or on the
farm (docs/targets.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import grpc

from torchfarm.kernels import elf, triton_check, triton_request
from torchfarm.v1 import farm_pb2, farm_pb2_grpc
from torchfarm.wire import builds, targets

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""gRPC send and receive limit, as the SDK's."""


def targets_table(status: farm_pb2.FarmStatus) -> list[list[str]]:
    """Rows of (target, graph workers, kernel workers), one per target a live worker serves."""
    by_target: dict[str, dict[str, list[str]]] = {}
    for w in status.workers:
        for served in w.targets:
            row = by_target.setdefault(served.target, {"graph": [], "kernel": []})
            for job in served.jobs:
                row.setdefault(job, []).append(w.name)
    return [
        [t, ",".join(sorted(kinds["graph"])) or "-", ",".join(sorted(kinds["kernel"])) or "-"]
        for t, kinds in sorted(by_target.items())
    ]


def builds_table(status: farm_pb2.FarmStatus) -> list[list[str]]:
    """Rows of (target, build, graph workers), one per build a target's graph workers run:
    a client reaches only the workers of its own build (torchfarm/wire/builds.py)."""
    by_build: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for w in status.workers:
        if not w.fingerprint:
            continue
        build = {k: w.fingerprint.get(k, "") for k in builds.FIELDS}
        for served in w.targets:
            if "graph" in served.jobs:
                entry = by_build.setdefault((served.target, builds.digest(build)), (builds.label(build), []))
                entry[1].append(w.name)
    return [
        [target, label, ",".join(sorted(names))]
        for (target, _), (label, names) in sorted(by_build.items())
    ]


def add_kernel_parser(sub: argparse._SubParsersAction) -> None:
    kernel = sub.add_parser("kernel", help="Triton kernels compiled by the farm for a GPU target")
    ksub = kernel.add_subparsers(dest="kernel_command", required=True)
    c = ksub.add_parser("compile", help="compile FILE.py::name for --target; write the binary")
    c.add_argument("spec", help="FILE.py::kernel_name (the file is read, never imported)")
    c.add_argument("--target", required=True, help='"cuda:sm_90", "rocm:gfx942", ...')
    c.add_argument(
        "--signature", required=True,
        help='Triton types of every parameter: "*fp32,*fp32,i32,constexpr" or "x=*fp32,n=i32,..."',
    )
    c.add_argument(
        "--constexpr", action="append", default=[], metavar="NAME=VALUE",
        help="a constexpr parameter's value (JSON: 1024, 0.5, true); repeat for each",
    )
    c.add_argument("--num-warps", type=int, default=0)
    c.add_argument("--num-stages", type=int, default=0)
    c.add_argument(
        "--triton-version", default=None,
        help='Triton that must compile it (default: the local one; "" for the farm\'s)',
    )
    c.add_argument("--remote", default="", help="grpc://host:port (default TORCHFARM_REMOTE)")
    c.add_argument("--timeout", type=float, default=180.0)
    c.add_argument("-o", "--output", default="", help="binary path (default: NAME.cubin / NAME.hsaco)")
    c.add_argument("--asm", default="", help="also write the PTX / AMDGCN here")
    c.add_argument("--metadata", default="", help="also write Triton's metadata (JSON) here")
    c.set_defaults(run=_kernel_compile)


def _constexprs(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--constexpr {item!r} is not NAME=VALUE")
        try:
            out[name.strip()] = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"--constexpr {item!r}: the value is not JSON: {e}") from e
    return out


def _kernel_compile(args: argparse.Namespace) -> int:
    path, sep, name = args.spec.rpartition("::")
    if not sep or not path or not name:
        print("torchfarm kernel compile: give FILE.py::kernel_name", file=sys.stderr)
        return 2
    address = (args.remote or os.environ.get("TORCHFARM_REMOTE", "")).removeprefix("grpc://")
    if not address:
        print("torchfarm kernel compile: give --remote or set TORCHFARM_REMOTE", file=sys.stderr)
        return 2
    try:
        source = Path(path).read_text()
        request = triton_request.build_kernel_request(
            source, name, target=args.target, signature=args.signature,
            constexprs=_constexprs(args.constexpr), num_warps=args.num_warps,
            num_stages=args.num_stages, triton_version=args.triton_version,
            label=f"{Path(path).name}::{name} (torchfarm kernel compile)",
        )
    except (OSError, ValueError) as e:  # TargetError, KernelRejected, KernelRequestError
        kind = "rejected" if isinstance(e, triton_check.KernelRejected) else "error"
        print(f"torchfarm kernel compile: {kind}: {e}", file=sys.stderr)
        return 2
    token = os.environ.get("TORCHFARM_TOKEN", "")
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    with grpc.insecure_channel(address, options=options) as channel:
        try:
            reply = farm_pb2_grpc.CompileFarmStub(channel).CompileKernel(
                request, timeout=args.timeout, metadata=metadata
            )
        except grpc.RpcError as e:
            print(f"torchfarm kernel compile: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    try:
        info = triton_request.check_reply(reply, args.target)
    except elf.NotAKernel as e:
        print(f"torchfarm kernel compile: refused the farm's binary: {e}", file=sys.stderr)
        return 1
    out = Path(args.output or f"{name}.{reply.kind}")
    out.write_bytes(reply.binary)
    if args.asm:
        Path(args.asm).write_text(reply.assembly)
    if args.metadata:
        Path(args.metadata).write_text(reply.metadata_json)
    target = targets.parse(args.target)
    print(
        f"{out}: {reply.kind} for {target} ({info.arch}), {len(reply.binary)} bytes; "
        f"key {reply.key[:12]}, {'cache hit' if reply.cache_hit else 'compiled'} by "
        f"{reply.worker or '?'} with Triton {reply.triton_version} in {reply.compile_seconds:.2f}s"
    )
    return 0
