"""Encodes a torch.export program for the farm: its graph in the farm's own format, its
weights as raw bytes, its calling convention as pytree JSON. No pickle anywhere.

Why not `torch.export.save`: in torch 2.13 its archive keeps the graph as JSON, but the
weights and constants go through `torch.save`, so reading them on a worker means
`torch.load` of bytes a client chose. Even `weights_only=True` is a restricted
unpickler over untrusted input; the farm's rule is that nothing a worker receives is
unpickled at all. The farm's graph format already carries ATen ops (checked against
the allow-list by name) and symbolic sizes, so an exported graph needs only the
weights and the pytree specs besides (proto/torchfarm/v1/farm.proto, ExportSpec).

Pinned against torch 2.13.0 (tests/unit/test_export.py):
- `ExportedProgram.graph_signature.input_specs` lists every placeholder, in order, with
  its kind (PARAMETER, BUFFER with `persistent`, CONSTANT_TENSOR, USER_INPUT) and
  attribute path; parameters and persistent buffers are in `ep.state_dict`,
  non-persistent buffers and lifted constants in `ep.constants`;
- a placeholder's `meta["val"]` is a FakeTensor whose SymInt sizes carry the export's
  ShapeEnv, and `ep.range_constraints` maps each symbol to its range;
- `ep.call_spec.in_spec` / `out_spec` are TreeSpecs that `treespec_dumps` writes as JSON.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from torchfarm.fx.encode import UnsupportedGraph, dtype_name, encode_graph
from torchfarm.fx.internals import resolve
from torchfarm.graph import exportcheck
from torchfarm.graph.graph_errors import GraphError
from torchfarm.graph.graphcheck import DTYPE_ITEMSIZE, GraphLimits
from torchfarm.v1 import farm_pb2, graph_pb2

pytree = resolve("pytree")

Weight = farm_pb2.ExportWeight
_KINDS = {
    InputKind.PARAMETER: Weight.PARAMETER,
    InputKind.BUFFER: Weight.BUFFER,
    InputKind.CONSTANT_TENSOR: Weight.CONSTANT,
}


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A tensor's elements, contiguous and little-endian, without numpy or pickle."""
    if sys.byteorder != "little":
        raise UnsupportedGraph("exporting weights needs a little-endian client")
    flat = t.detach().to("cpu").contiguous().clone()
    return ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size()) if flat.numel() else b""


def _weight(ep: ExportedProgram, spec: Any, node: torch.fx.Node) -> farm_pb2.ExportWeight:
    fqn = spec.target
    if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
        value = ep.state_dict[fqn]
    else:
        value = ep.constants[fqn]
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        raise UnsupportedGraph(f"weight {fqn} is not a dense tensor")
    dtype = dtype_name(value.dtype)
    if dtype not in DTYPE_ITEMSIZE:
        raise UnsupportedGraph(f"weight {fqn} has dtype {dtype}")
    return Weight(
        placeholder=node.name,
        fqn=fqn,
        kind=_KINDS[spec.kind],
        persistent=bool(spec.persistent),
        dtype=dtype,
        shape=list(value.shape),
        data=tensor_bytes(value),
    )


def encode_export(
    ep: ExportedProgram, limits: GraphLimits = GraphLimits()
) -> tuple[graph_pb2.Graph, farm_pb2.ExportSpec]:
    """The program's graph and its ExportSpec; UnsupportedGraph if the format cannot
    hold it (a buffer mutated in forward, a non-tensor input, an op off the allow-list)."""
    signature = ep.graph_signature
    for out in signature.output_specs:
        if out.kind != OutputKind.USER_OUTPUT:
            raise UnsupportedGraph(
                f"the program's signature returns a {out.kind.name} ({out.target}); the farm "
                "exports programs whose outputs are all user outputs"
            )
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    spec = farm_pb2.ExportSpec(
        in_spec=pytree.treespec_dumps(ep.call_spec.in_spec),
        out_spec=pytree.treespec_dumps(ep.call_spec.out_spec),
    )
    for node, input_spec in zip(placeholders, signature.input_specs, strict=True):
        if input_spec.kind == InputKind.USER_INPUT:
            if not isinstance(node.meta.get("val"), torch.Tensor):
                raise UnsupportedGraph(
                    f"input {node.name} is a {type(node.meta.get('val')).__name__}; the farm "
                    "exports programs whose inputs are all tensors"
                )
            continue
        if input_spec.kind not in _KINDS:
            raise UnsupportedGraph(f"input {node.name} is a {input_spec.kind.name}")
        spec.weights.append(_weight(ep, input_spec, node))
    graph = encode_graph(ep.graph_module, [n.meta.get("val") for n in placeholders], limits=limits)
    kinds = {w.placeholder: w.kind for w in spec.weights}
    for node in graph.nodes:
        if node.name in kinds:
            node.tensor.kind = (
                graph_pb2.TensorMeta.PARAMETER if kinds[node.name] == Weight.PARAMETER
                else graph_pb2.TensorMeta.BUFFER
            )
    declared = {s.name for s in graph.symbols}
    for symbol, vr in sorted(ep.range_constraints.items(), key=lambda kv: str(kv[0])):
        if str(symbol) in declared:
            upper = _finite(vr.upper)
            spec.dims.add(symbol=str(symbol), min=_finite(vr.lower) or 0, max=upper or 0)
    try:
        exportcheck.validate_export(graph, spec)
    except GraphError as e:
        raise UnsupportedGraph(f"encoded export is not valid: {e}") from e
    return graph, spec


def _finite(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # int_oo
        return None
    return number if abs(number) < 2**62 else None
