"""The decomposition stage: AOTAutograd's graphs, made in one job and lowered in another.

`decompose_graph` runs the compile `lower_graph` would run (same entry point, same
config patch), and stops it where AOTAutograd has traced the joint graph with the
PrimTorch / core-ATen decompositions and partitioned it into forward and backward
graphs (an inference graph: where it has traced the one decomposed graph). Those
graphs leave the job in the project's own graph format (`torchfarm.fx.encode`, no pickle),
with a map from their symbols to the client's symbol names, the few numbers tracing
and the partition wrote into AOTAutograd's runtime metadata, and the shape guards
tracing added (the lowering ships them with its own).

`using_decomposition` is the other half. During the lowering job's compile it stands in
for AOTAutograd's graph capture and partition: the capture returns without tracing,
the partition returns the decoded graphs and restores those numbers, and everything
else (metadata collection, runtime wrappers, Inductor on each graph, serialization)
runs as it always does. The artifact is the one a compile that decomposed in place
would have made.

A graph the format or these two seams cannot carry raises `NotDecomposable` (tensor
subclasses, effect tokens, opaque objects, higher-order ops, a symbol the request did
not have, a runtime-metadata change not listed in `_SAVED_META`): that graph is
decomposed inside its lowering job instead.

Pinned against torch 2.13.0 (tests/unit/test_decompose.py):
- `graph_compile.aot_stage1_graph_capture` calls `aot_dispatch_autograd_graph` (or
  `aot_dispatch_base_graph` for inference) by its module-global name, and
  `graph_compile.aot_stage2_autograd` calls `_aot_stage2a_partition` so too;
- `_aot_stage2a_partition` writes `_SAVED_META` into the runtime metadata
  (`_partition_joint_graph_into_fw_bw`, `_categorize_saved_tensors_for_backward`);
- Inductor propagates fake values through a partitioned graph before any pass reads
  them, so the lowering decodes only its placeholders' values.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from torchfarm.fx import guards as shape_guards
from torchfarm.fx.decode import DecodedGraph, decode_graph_into
from torchfarm.fx.encode import UnsupportedGraph, encode_graph
from torchfarm.fx.internals import resolve
from torchfarm.graph.graph_errors import GraphError
from torchfarm.v1 import graph_pb2
from workers import compiler

JOINT = "joint"
"""A training graph: forward and backward graphs."""
INFERENCE = "inference"
"""A graph that needs no gradient: one forward graph."""

_SAVED_META: dict[str, type] = {
    "mutated_inp_stream_indices": list,
    "num_symints_saved_for_bw": int,
    "num_opaque_objects_saved_for_bw": int,
    "num_tensors_saved_with_no_vc_check": int,
    "bw_donated_idxs": list,
    "dynamic_saved_tensors_idxs": dict,
}
"""`ViewAndMutationMeta` fields the graph capture and the partition may set, which the
lowering job restores: any other change makes the graph `NotDecomposable`."""

_MUST_BE_ZERO = ("num_opaque_objects_saved_for_bw", "num_graphsafe_rng_states")
"""Fields the partition sets that only features this stage does not carry make nonzero."""


class NotDecomposable(compiler.WrongPath):
    """This graph is decomposed inside its lowering job; the message says why."""


@dataclass
class Decomposition:
    """AOTAutograd's decomposed graphs of one request."""

    kind: str
    """`JOINT` or `INFERENCE`."""
    forward: graph_pb2.Graph
    backward: graph_pb2.Graph | None = None
    symbols: dict[str, str] = field(default_factory=dict)
    """Each symbol name the graphs use → the client's name for it, which the lowering
    job's decoded request binds to its own ShapeEnv's expression."""
    partition: dict[str, Any] = field(default_factory=dict)
    """`meta`: the `_SAVED_META` fields tracing changed, and for JOINT the partition's
    counts (`num_fw_outs_saved_for_bw`, `num_symints_saved_for_bw`,
    `indices_of_inps_to_detach`)."""
    guards: list[Any] = field(default_factory=list)
    """Shape guards the decomposition added (`torchfarm.fx.guards` trees): they are part of what
    the artifact assumes, so they travel with it."""
    seconds: float = 0.0
    """How long the decomposition took, for its log line; the stored stage record
    (workers/jobs/lower.py) carries it on."""

    def to_fields(self) -> dict[str, bytes]:
        """The Redis hash fields this is stored as (`Store.put_decomposition`)."""
        head = {
            "kind": self.kind, "symbols": self.symbols, "partition": self.partition,
            "guards": self.guards,
        }
        out = {
            "head": json.dumps(head, sort_keys=True).encode(),
            "forward": self.forward.SerializeToString(),
        }
        if self.backward is not None:
            out["backward"] = self.backward.SerializeToString()
        return out

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Decomposition:
        """Raises `NotDecomposable` for a record that does not parse."""
        try:
            head = json.loads(fields[b"head"])
            forward = graph_pb2.Graph.FromString(fields[b"forward"])
            backward = (
                graph_pb2.Graph.FromString(fields[b"backward"]) if b"backward" in fields else None
            )
            kind = head["kind"]
        except (KeyError, ValueError, TypeError) as e:
            raise NotDecomposable(f"the stored decomposition does not parse: {e!r}") from e
        if kind not in (JOINT, INFERENCE) or (kind == JOINT) != (backward is not None):
            raise NotDecomposable(f"the stored decomposition is inconsistent (kind {kind!r})")
        return cls(
            kind, forward, backward, dict(head.get("symbols", {})), head.get("partition", {}),
            head.get("guards", []),
        )


class _Captured(compiler.WrongPath):
    """Ends the decomposition's compile once the graphs exist."""


def decompose_graph(
    decoded: DecodedGraph, *, dynamic: bool = False, mode: str = "",
    inductor_options: dict[str, Any] | None = None,
) -> Decomposition:
    """AOTAutograd's decomposed graphs of `decoded`, encoded. Raises `NotDecomposable`,
    or `compiler.CompileFailed` when AOTAutograd itself fails."""
    names = {str(expr): name for name, expr in decoded.symbols.items() if expr.is_Symbol}
    mark = shape_guards.snapshot(decoded.shape_env)
    t0 = time.perf_counter()
    got = _graphs_of(decoded, dynamic, mode, inductor_options, plain=True)
    seconds = time.perf_counter() - t0
    if "kind" not in got:
        # An AOTAutograd cache hit on this worker traces nothing: the lowering is as cheap.
        raise NotDecomposable("AOTAutograd traced nothing (a cache hit on this worker)")
    by_symbol = {expr: name for name, expr in decoded.symbols.items() if expr.is_Symbol}
    try:
        guards = [
            shape_guards.encode(g, by_symbol) for g in shape_guards.added_since(decoded.shape_env, mark)
        ]
    except shape_guards.GuardError as e:
        raise NotDecomposable(f"a shape guard the farm cannot ship: {e}") from e
    meta = got["meta"]
    changed = {k for k, v in _meta_view(meta).items() if got["before"].get(k) != v}
    unexpected = changed - set(_SAVED_META) - {"tangent_source_stack_traces"}
    if unexpected:
        raise NotDecomposable(f"tracing changed runtime metadata {sorted(unexpected)}")
    saved = {"meta": {k: _to_json(getattr(meta, k)) for k in sorted(changed & set(_SAVED_META))}}
    if got["kind"] == INFERENCE:
        graph = got["out"][0]
        return Decomposition(
            INFERENCE, _encode(graph, names), symbols=names, partition=saved, guards=guards,
            seconds=seconds,
        )
    fw, bw, n_saved, n_symints, detach, _ = got["out"]
    joint_partition = {
        **saved,
        "num_fw_outs_saved_for_bw": n_saved,
        "num_symints_saved_for_bw": n_symints,
        "indices_of_inps_to_detach": list(detach),
    }
    return Decomposition(
        JOINT, _encode(fw, names), _encode(bw, names), names, joint_partition, guards, seconds
    )


def traced_graphs(
    decoded: DecodedGraph, *, dynamic: bool = False, mode: str = "",
    inductor_options: dict[str, Any] | None = None,
) -> list[str]:
    """A listing of each of AOTAutograd's graphs of `decoded` (forward and backward, or the
    one inference graph), traced as the compile would trace them, tensor subclasses
    included, and stopped there. AOTAutograd's cache is off, so every call traces.
    Raises `compiler.CompileFailed` when AOTAutograd fails."""
    with resolve("functorch_config").patch(enable_autograd_cache=False):
        got = _graphs_of(decoded, dynamic, mode, inductor_options, plain=False)
    graphs = got["out"][:1] if got["kind"] == INFERENCE else got["out"][:2]
    return [listing(gm) for gm in graphs]


def listing(gm: torch.fx.GraphModule) -> str:
    """`gm`'s graph, a line a node: the node's op, target, arguments and value (a tensor's
    dtype, device, shape and strides), every node named by its position. Two graphs that
    list the same compute the same, whatever names tracing gave their nodes: torch 2.12
    numbers the nodes of the first trace in a process apart from the next ones'."""
    position: dict[torch.fx.Node, str] = {}
    lines = []
    for node in gm.graph.nodes:
        position[node] = f"%{len(position)}"
        target = "" if node.op == "placeholder" else node.target
        args = torch.fx.node.map_arg((node.args, node.kwargs), position.__getitem__)
        lines.append(f"{position[node]} {node.op} {target} {args!r} {_value(node.meta.get('val'))}")
    return "\n".join(lines)


def _value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {value.device} {tuple(value.shape)} {tuple(value.stride())}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_value(v) for v in value) + ")"
    return repr(value) if isinstance(value, (torch.SymInt, int, float, bool)) else type(value).__name__


def _graphs_of(
    decoded: DecodedGraph, dynamic: bool, mode: str, inductor_options: dict[str, Any] | None,
    *, plain: bool,
) -> dict[str, Any]:
    """Runs the compile up to AOTAutograd's graphs: `kind`, JOINT or INFERENCE; `out`, what
    the partition (or the inference capture) returned; `meta`, the runtime metadata, and
    `before`, a view of it before tracing. Absent `kind`, AOTAutograd's cache answered.
    With `plain`, a graph of tensor subclasses raises `NotDecomposable`."""
    graph_compile = resolve("graph_compile")
    got: dict[str, Any] = {}
    real_capture = graph_compile.aot_dispatch_autograd_graph
    real_base = graph_compile.aot_dispatch_base_graph
    real_partition = graph_compile._aot_stage2a_partition

    def capture(*args: Any, fw_metadata: Any, **kwargs: Any) -> Any:
        got["before"] = _meta_view(fw_metadata)
        return real_capture(*args, fw_metadata=fw_metadata, **kwargs)

    def partition(*args: Any) -> Any:
        out = real_partition(*args)
        maybe_subclass_meta, fw_metadata = args[2], args[3]  # 2.13 passes a partition_fn after
        if plain:
            _check_plain(maybe_subclass_meta, fw_metadata)
        got.update(kind=JOINT, out=out, meta=fw_metadata)
        raise _Captured

    def base(*args: Any, fw_metadata: Any, **kwargs: Any) -> Any:
        got["before"] = _meta_view(fw_metadata)
        out = real_base(*args, fw_metadata=fw_metadata, **kwargs)
        if plain:
            _check_plain(out[3], fw_metadata)
        got.update(kind=INFERENCE, out=out, meta=fw_metadata)
        raise _Captured

    stages = _patched(graph_compile, {
        "aot_dispatch_autograd_graph": capture,
        "aot_dispatch_base_graph": base,
        "_aot_stage2a_partition": partition,
    })
    try:
        compiler.run_compile(
            decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode, dynamic=dynamic, mode=mode,
            inductor_options=inductor_options, around=stages,
        )
    except compiler.CompileFailed:
        raise
    except Exception as e:
        reason = compiler.wrong_path(e)
        if isinstance(reason, NotDecomposable):
            raise reason from None
        if reason is None:
            raise compiler.CompileFailed(f"{type(e).__name__}: {e}") from e
    return got


@contextlib.contextmanager
def using_decomposition(
    dec: Decomposition, decoded: DecodedGraph, used: list[str]
) -> Iterator[None]:
    """Makes the lowering compile of `decoded` take `dec`'s graphs instead of tracing
    and partitioning its own. Appends to `used` what it stood in for, so the caller
    can tell a compile that never reached AOTAutograd's tracing (a cache hit) from one
    that used the decomposition. Raises `NotDecomposable` from inside the compile
    when `dec` does not fit it."""
    graph_compile = resolve("graph_compile")

    missing = sorted(set(dec.symbols.values()) - set(decoded.symbols))
    if missing:
        raise NotDecomposable(f"the request has no symbols {missing}")
    symbols = {local: decoded.symbols[client] for local, client in dec.symbols.items()}

    def capture(
        flat_fn: Any, flat_args: Any, flat_args_descs: Any, aot_config: Any, *, fw_metadata: Any
    ) -> Any:
        if dec.kind != JOINT:
            raise NotDecomposable("the request needs a gradient; it was decomposed for inference")
        used.append("capture")
        empty = torch.fx.Graph()
        empty.output(())
        joint = torch.fx.GraphModule(torch.nn.Module(), empty)
        return (
            joint,
            (list(flat_args), list(fw_metadata.traced_tangents)),
            (list(flat_args_descs), list(fw_metadata.traced_tangents_descs)),
            None,
        )

    def partition(
        fx_g: Any, joint_inputs: Any, maybe_subclass_meta: Any, fw_metadata: Any,
        aot_config: Any, partition_fn: Any = None,  # torch 2.12 passes none
    ) -> Any:
        _check_plain(maybe_subclass_meta, fw_metadata)
        primals = list(joint_inputs[0])
        fake_mode = _fake_mode(primals)
        # Inductor propagates fake values through a partitioned graph before anything
        # reads them (compile_fx's additional_fake_tensor_prop): placeholders suffice.
        fw = _decode(dec.forward, fake_mode, symbols, primals, propagate=False)
        assert dec.backward is not None  # from_fields checks it for JOINT
        bw = _decode(dec.backward, fake_mode, symbols, None, propagate=False)
        _restore(dec, fw_metadata)
        used.append("partition")
        p = dec.partition
        return (
            fw, bw, int(p["num_fw_outs_saved_for_bw"]), int(p["num_symints_saved_for_bw"]),
            [int(i) for i in p["indices_of_inps_to_detach"]], primals,
        )

    def base(
        flat_fn: Any, flat_args: Any, flat_args_descs: Any, aot_config: Any, *, fw_metadata: Any
    ) -> Any:
        if dec.kind != INFERENCE:
            raise NotDecomposable("the request needs no gradient; it was decomposed for training")
        if fw_metadata.tokens:
            raise NotDecomposable("the graph has effect tokens")
        args = list(flat_args)
        # Inductor runs the joint-graph passes on an inference graph first, and their
        # pattern matcher reads every node's fake value.
        graph = _decode(dec.forward, _fake_mode(args), symbols, args, propagate=True)
        _restore(dec, fw_metadata)
        used.append("base")
        return graph, args, list(flat_args_descs), None

    with _patched(graph_compile, {
        "aot_dispatch_autograd_graph": capture,
        "aot_dispatch_base_graph": base,
        "_aot_stage2a_partition": partition,
    }):
        yield


def _restore(dec: Decomposition, fw_metadata: Any) -> None:
    """Writes the runtime-metadata fields the decomposition's tracing set."""
    for name, value in dec.partition.get("meta", {}).items():
        if name not in _SAVED_META:
            raise NotDecomposable(f"the stored decomposition sets {name}")
        setattr(fw_metadata, name, _from_json(name, value, _SAVED_META[name]))


def _check_plain(maybe_subclass_meta: Any, fw_metadata: Any) -> None:
    if maybe_subclass_meta is not None:
        raise NotDecomposable("the graph has tensor-subclass inputs or outputs")
    if fw_metadata.tokens:
        raise NotDecomposable("the graph has effect tokens")
    for name in _MUST_BE_ZERO:
        if getattr(fw_metadata, name, 0):
            raise NotDecomposable(f"the partition set {name}")


def _meta_view(meta: Any) -> dict[str, str]:
    """A comparable view of the runtime metadata: the repr of every attribute, the
    dataclass fields and those `__post_init__` derives alike."""
    return {name: repr(value) for name, value in vars(meta).items()}


def _encode(gm: torch.fx.GraphModule, names: dict[str, str]) -> graph_pb2.Graph:
    """`gm` in the graph format; every symbol it uses must be one of `names`."""
    placeholders = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    try:
        graph = encode_graph(gm, placeholders)
    except UnsupportedGraph as e:
        raise NotDecomposable(f"the decomposed graph does not fit the format: {e}") from e
    if graph.subgraphs:
        # A partitioned graph's higher-order ops (cond, invoke_subgraph, flex_attention)
        # read fake values on their bodies' nodes, which a lowering that decodes only
        # the placeholders' values does not make.
        raise NotDecomposable("the decomposed graph has higher-order ops with subgraphs")
    for sym in graph.symbols:
        if sym.name not in names:
            raise NotDecomposable(f"the decomposition made a new symbol {sym.name}")
    return graph


def _decode(
    graph: graph_pb2.Graph, fake_mode: Any, symbols: dict[str, sympy.Expr],
    inputs: Sequence[Any] | None, *, propagate: bool,
) -> torch.fx.GraphModule:
    try:
        return decode_graph_into(graph, fake_mode, symbols, inputs, propagate=propagate)
    except GraphError as e:
        raise NotDecomposable(f"the stored decomposition does not decode: {e}") from e


def _fake_mode(values: Sequence[Any]) -> Any:
    mode = resolve("detect_fake_mode")(list(values))
    if mode is None:
        raise NotDecomposable("AOTAutograd's inputs are not fake tensors")
    return mode


def _to_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in value.items()}
    return value


def _from_json(name: str, value: Any, kind: type) -> Any:
    if value is None:
        return None
    if kind is dict:
        return {int(k): set(v) for k, v in value.items()}
    if kind is list:
        return [None if v is None else int(v) for v in value]
    if not isinstance(value, int):
        raise NotDecomposable(f"{name} is {value!r}, not an int")
    return value


@contextlib.contextmanager
def _patched(module: Any, replacements: dict[str, Any]) -> Iterator[None]:
    saved = {name: getattr(module, name) for name in replacements}
    for name, fn in replacements.items():
        setattr(module, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)

