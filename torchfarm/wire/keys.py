"""The farm's cache key: one digest over everything that decides what an artifact is.

The key covers the graph (ops, arguments and the input metadata on its placeholders),
the torch and Triton builds, the target (device kind, GPU arch or CPU ISA, compiler)
and the compile options. Inductor's own cache key leaves the CPU ISA out, and an
artifact built for AVX-512 then loads under AVX2 and returns wrong numbers
(shared/notes/torch-facts.md), so every one of these fields is in.

The tenant's cache namespace is in the key too, so two tenants never share a key, and
hence an artifact, unless the operator gives them one namespace (torchfarm/trust/tokens.py).

The request's `label` is free text for logs and is deliberately not part of the key.

An export request (`export` set: an AOTInductor package, sdk.export) has a key of its
own domain, `EXPORT_KEY_VERSION`, which adds the weights' digests, the pytree specs and
the dynamic dims, and keeps the graph's hints (the worker exports at those sizes).

A dynamic graph's symbols carry hints, the sizes seen at capture time. The key leaves
them out, so the same symbolic graph captured at batch 4 and at batch 8 shares one
artifact; the shapes stay in as expressions over the symbols, with the symbols' ranges.
What Inductor decided from the hints comes back as shape guards in the manifest
(torchfarm/fx/guards.py). When those are false for a client's hints, it resubmits with
`specialize_hints`, and the key then covers the hints too.

A graph with device meshes (DTensor) carries its rank, and the key leaves it out: the
ranks that send the same graph share one key, so one compile. The worker compiles it
only where it proves the compile the same at every such rank (workers/ranks.py); where
it is not, the job fails RANK_SPECIFIC and each rank resubmits with `per_rank`, and its
key then covers the rank. A per-rank key is the one such graphs had before.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from torchfarm.v1 import farm_pb2, graph_pb2

KEY_VERSION = "torchfarm.key/3"
"""Changes whenever the key's inputs change, so old and new keys never collide."""

INDUCTOR_FIXES = ("pytorch/pytorch#191837", "pytorch/pytorch#133734", "pytorch/pytorch#185509")
"""The upstream Inductor bugs the workers fix before they compile (workers/inductor_fixes.py),
by their issues. They are in the key: a farm that carries a fix never serves an artifact
compiled without it, from its cache or from an older farm's."""


WORKER_CHANGES = ("static-parameters",)
"""Changes to how the workers compile that change an artifact, beyond the fixes above:
"static-parameters", a graph's parameters and buffers passed to AOTAutograd as static
inputs, as a local torch.compile passes them (workers/compiler.py `static_inputs`). In
the key, so an artifact compiled before a change is never served after it."""


def graph_digest(graph: graph_pb2.Graph, *, hints: bool = True, rank: bool = True) -> str:
    """A digest of the graph's deterministic protobuf encoding; with `hints=False`, of
    the encoding with every symbol's and size expression's hint cleared; with
    `rank=False`, with its rank cleared."""
    if not rank and graph.rank:
        graph = _copy(graph)
        graph.ClearField("rank")
    if not hints and graph.symbols:
        graph = _without_hints(graph)
    return "sha256:" + hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()


_HINTED = (graph_pb2.SymExpr.DESCRIPTOR, graph_pb2.Symbol.DESCRIPTOR)


def _copy(graph: graph_pb2.Graph) -> graph_pb2.Graph:
    copy = graph_pb2.Graph()
    copy.CopyFrom(graph)
    return copy


def rank_shared(request: farm_pb2.CompileRequest) -> bool:
    """Whether the request's key leaves its graph's rank out (see the module's text)."""
    return bool(request.graph.meshes) and not request.per_rank and not request.HasField("export")


MAX_CHECKED_RANKS = 16
"""The most ranks besides the client's that a job's rank check (workers/ranks.py)
traces the graph at; past it the check traces none and the graph compiles per rank."""


def traced_ranks(request: farm_pb2.CompileRequest) -> int:
    """How many ranks the worker's rank check traces this request's graph at, as the
    request's meshes and groups say (torch-free, for the coordinator's quota): the
    client's and each other rank that sends the same bytes; 0 where it traces none."""
    if not rank_shared(request):
        return 0
    graph = request.graph
    try:
        mine = _groups_at(graph, graph.rank)
        others = [
            r for r in sorted({r for mesh in graph.meshes for r in mesh.ranks})
            if r != graph.rank and all(r in g.ranks for g in graph.groups)
            and all(r in m.ranks for m in graph.meshes) and _groups_at(graph, r) == mine
        ]
    except ValueError:
        return 0  # a mesh the worker refuses before it traces
    return 1 + len(others) if 0 < len(others) <= MAX_CHECKED_RANKS else 0


def _groups_at(graph: graph_pb2.Graph, rank: int) -> list[list[int]]:
    """The ranks of `rank`'s group along each dimension of each of the graph's meshes
    (torchfarm/fx/meshes.py `mesh_groups`, without torch)."""
    groups = []
    for mesh in graph.meshes:
        shape, ranks = list(mesh.shape), list(mesh.ranks)
        size = 1
        for n in shape:
            size *= n
        if size != len(ranks) or len(mesh.group_names) > len(shape):
            raise ValueError("a mesh whose shape does not hold its ranks")
        where, flat = [], ranks.index(rank)
        for n in reversed(shape):
            where.append(flat % n)
            flat //= n
        where.reverse()
        for dim in range(len(mesh.group_names)):
            members = []
            for i in range(shape[dim]):
                at = [*where[:dim], i, *where[dim + 1:]]
                index = 0
                for n, c in zip(shape, at, strict=True):
                    index = index * n + c
                members.append(ranks[index])
            groups.append(members)
    return groups


def _without_hints(graph: graph_pb2.Graph) -> graph_pb2.Graph:
    copy = _copy(graph)
    stack: list[Any] = [copy]
    while stack:
        message = stack.pop()
        if message.DESCRIPTOR in _HINTED:
            message.ClearField("hint")
            continue
        for field, value in message.ListFields():
            if field.message_type is None:
                continue
            if field.is_repeated:
                stack.extend(value)
            else:
                stack.append(value)
    return copy


def options_canonical(options: farm_pb2.CompileOptions) -> dict[str, Any]:
    """The compile options as the key sees them. The global state enters only when set,
    so the keys of graphs captured with grad on and no autocast (every request before
    those fields) are unchanged."""
    canonical: dict[str, Any] = {
        "mode": options.mode,
        "dynamic": options.dynamic,
        "inductor": sorted((o.name, o.json_value) for o in options.inductor),
    }
    if options.no_grad:
        canonical["no_grad"] = True
    if options.autocast:
        canonical["autocast"] = sorted((a.device_type, a.dtype) for a in options.autocast)
    if options.sdpa_backends:
        canonical["sdpa_backends"] = list(options.sdpa_backends)  # in priority order
    if options.deterministic:
        canonical["deterministic"] = "warn_only" if options.deterministic_warn_only else True
    return canonical


def _canonical(request: farm_pb2.CompileRequest, namespace: str) -> dict[str, Any]:
    target, build = request.target, request.build
    shared = rank_shared(request)
    canonical: dict[str, Any] = {
        "namespace": namespace,
        "graph": graph_digest(request.graph, hints=request.specialize_hints, rank=not shared),
        "specialize_hints": request.specialize_hints,
        "target": {
            "device": target.device,
            "arch": target.arch,
            "isa": target.isa,
            "compiler": target.compiler,
        },
        "build": {
            "torch_version": build.torch_version,
            "torch_git": build.torch_git,
            "triton_version": build.triton_version,
            "python": build.python,
            "platform": build.platform,
        },
        "options": options_canonical(request.options),
        "inductor_fixes": list(INDUCTOR_FIXES),
        "worker_changes": list(WORKER_CHANGES),
    }
    if shared:
        canonical["ranks"] = "shared"  # never a per-rank key, whose graph has rank 0
    return canonical


EXPORT_KEY_VERSION = "torchfarm.export/1"
"""The domain of export keys (a request with `export` set): an AOTInductor package and a
torch.compile artifact of the same graph never share a key."""


def _export_canonical(request: farm_pb2.CompileRequest, namespace: str) -> dict[str, Any]:
    """`_canonical`, with the graph's hints (the worker exports at them) and the export
    spec: every weight's digest and metadata, the pytree specs and the dynamic dims."""
    spec = request.export
    return {
        **_canonical(request, namespace),
        "graph": graph_digest(request.graph, hints=True),
        "export": {
            "weights": [
                [w.placeholder, w.fqn, int(w.kind), w.persistent, w.dtype, list(w.shape),
                 "sha256:" + hashlib.sha256(w.data).hexdigest()]
                for w in spec.weights
            ],
            "in_spec": spec.in_spec,
            "out_spec": spec.out_spec,
            "dims": [[d.symbol, d.min, d.max] for d in spec.dims],
        },
    }


def compute_key(request: farm_pb2.CompileRequest, namespace: str = "") -> str:
    """The hex SHA-256 that names the request's artifact in `namespace` of the cache."""
    if request.HasField("export"):
        canonical = {"version": EXPORT_KEY_VERSION, **_export_canonical(request, namespace)}
    else:
        canonical = {"version": KEY_VERSION, **_canonical(request, namespace)}
    body = json.dumps(
        canonical,
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(body.encode()).hexdigest()


NAMED_KEY = re.compile(r"[0-9a-z-]{1,128}\Z")
"""What a key a client names (GetJob, Watch, FetchArtifact, ExplainMiss) can be: a compile
or kernel key is 64 hex digits, a precompiled one `pc1-` and 64 more."""


def short(key: str) -> str:
    """The first 12 hex digits, for log lines."""
    return key[:12]


KERNEL_KEY_VERSION = "torchfarm.kernel/1"
"""Changes whenever the kernel key's inputs change."""


def compute_kernel_key(request: farm_pb2.KernelRequest, namespace: str = "") -> str:
    """The hex SHA-256 that names a compiled Triton kernel in `namespace` of the cache.

    It covers the tenant's namespace (as `compute_key`), the source text, the function's name, the signature (in order), the
    constexpr values (canonical JSON), the target, the compile options and the Triton
    version: everything that decides the binary. The label is not part of it.
    """
    body = {
        "version": KERNEL_KEY_VERSION,
        "namespace": namespace,
        "source": "sha256:" + hashlib.sha256(request.source.encode()).hexdigest(),
        "name": request.name,
        "signature": [[a.name, a.type] for a in request.signature],
        "constexprs": sorted(
            (o.name, json.dumps(json.loads(o.json_value), sort_keys=True))
            for o in request.constexprs
        ),
        "target": {"device": request.target.device, "arch": request.target.arch},
        "options": {
            "num_warps": request.options.num_warps,
            "num_stages": request.options.num_stages,
        },
        "triton_version": request.triton_version,
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
