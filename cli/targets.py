"""`torchfarm kernel compile` and the per-target view of `torchfarm status`. Free of torch.

    torchfarm kernel compile FILE.py::kernel --target cuda:sm_90 \\
        --signature '*fp32,*fp32,*fp32,i32,constexpr' --constexpr BLOCK=1024 \\
        [--num-warps 4] [--num-stages 3] [-o out.cubin] [--asm out.ptx] [--metadata out.json]

The file is read as text and sent; nothing in it is imported or run, here or on the
farm (docs/targets.md). The farm's answer is checked as `sdk.compile_kernel` checks it
(signed by a pinned key, for this request and target) before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cli.errors import CliError
from sdk.errors import ArtifactRejected, ConfigError, FarmError, KernelRejected
from sdk.triton_client import compile_kernel
from torchfarm.kernels import elf
from torchfarm.v1 import farm_pb2
from torchfarm.wire import builds


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
        raise CliError("give FILE.py::kernel_name", 2)
    remote = args.remote or os.environ.get("TORCHFARM_REMOTE", "")
    if not remote:
        raise CliError("give --remote or set TORCHFARM_REMOTE", 2)
    source = Path(path).read_text()
    try:
        k = compile_kernel(
            source, name, target=args.target, signature=args.signature,
            constexprs=_constexprs(args.constexpr), num_warps=args.num_warps,
            num_stages=args.num_stages, triton_version=args.triton_version, remote=remote,
            label=f"{Path(path).name}::{name} (torchfarm kernel compile)", timeout_s=args.timeout,
        )
    except (ConfigError, ValueError) as e:  # bad arguments: nothing was sent
        raise CliError(f"error: {e}", 2) from e
    except KernelRejected as e:  # by the checker here or the farm's, or Triton's compile error
        raise CliError(f"rejected: {e}", 2) from e
    except ArtifactRejected as e:
        raise CliError(f"refused the farm's kernel: {e}") from e
    except FarmError as e:
        raise CliError(str(e)) from e
    out = Path(args.output or f"{name}.{k.kind}")
    out.write_bytes(k.binary)
    if args.asm:
        Path(args.asm).write_text(k.assembly)
    if args.metadata:
        Path(args.metadata).write_text(json.dumps(k.metadata, sort_keys=True, indent=2) + "\n")
    print(
        f"{out}: {k.kind} for {k.target} ({elf.inspect_binary(k.binary).arch}), {len(k.binary)} bytes; "
        f"key {k.key[:12]}, {'cache hit' if k.cache_hit else 'compiled'} by "
        f"{k.worker or '?'} with Triton {k.triton_version} in {k.compile_seconds:.2f}s"
    )
    return 0
