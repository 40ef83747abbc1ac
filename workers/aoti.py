"""Builds an AOTInductor package from an export request: graph + weights → .pt2 bytes.

The client sent a torch.export program as the farm's own graph format (its ATen graph,
every parameter, buffer and lifted constant a placeholder) plus the weights as raw
bytes (sdk/export_codec.py). Nothing of it is unpickled. Here:

1. `decode_graph` rebuilds the graph; its targets resolve only through the allow-list.
2. `ExportedModule` puts the weights back at their attribute paths and calls that graph
   with them and the user's inputs, in placeholder order, taking and returning the
   same pytree structures as the client's model.
3. `torch.export.export` exports that module again, at the client's example sizes and
   with its dynamic dimensions, which gives an ExportedProgram equal to the client's
   (same ATen ops, same weights, same calling convention) built from public API only.
4. `torch._inductor.aoti_compile_and_package` builds the package.

Pinned against torch 2.13.0 (tests/unit/test_export.py):
- `torch.utils._pytree.treespec_loads` reads `treespec_dumps` JSON, protocol 1, and
  resolves node types only among registered pytree types;
- `torch.export.export` of a module whose forward is `(*args, **kwargs)` takes
  `dynamic_shapes` as `{"args": <per positional arg>, <kwarg name>: ...}`;
- `aoti_compile_and_package(ep, package_path=...)` needs `ep.example_inputs`, which
  `torch.export.export` sets.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from torchfarm.fx.decode import decode_graph
from torchfarm.fx.hooks import checked_aot_sources
from torchfarm.fx.internals import resolve
from torchfarm.graph import exportcheck
from torchfarm.v1 import farm_pb2, graph_pb2
from torchfarm.wire import options as farm_options
from workers import inductor_fixes

if TYPE_CHECKING:
    from torch.utils._pytree import TreeSpec

pytree = resolve("pytree")

log = logging.getLogger(__name__)

Weight = farm_pb2.ExportWeight


class ExportFailed(Exception):
    """torch.export or AOTInductor could not build the package; never retried."""


@dataclass(frozen=True)
class ExportResult:
    package: bytes
    """The .pt2 file's bytes."""
    timings: dict[str, float]


def weight_tensor(w: farm_pb2.ExportWeight, device: torch.device) -> torch.Tensor:
    """The weight's tensor from its raw little-endian bytes (exportcheck checked the size)."""
    dtype = getattr(torch, w.dtype)
    if not w.data:
        return torch.empty(tuple(w.shape), dtype=dtype, device=device)
    flat = torch.frombuffer(bytearray(w.data), dtype=torch.uint8).view(dtype)
    return flat.reshape(tuple(w.shape)).clone().to(device)


class ExportedModule(torch.nn.Module):
    """The client's model again: its weights at their attribute paths, its forward the
    exported graph."""

    _graph: torch.fx.GraphModule

    def __init__(
        self,
        graph_module: torch.fx.GraphModule,
        placeholders: list[str],
        weights: dict[str, tuple[farm_pb2.ExportWeight, torch.Tensor]],
        out_spec: TreeSpec,
    ):
        super().__init__()
        for w, tensor in weights.values():
            owner = self
            *path, leaf = w.fqn.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            if w.kind == Weight.PARAMETER:
                owner.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=False))
            else:
                owner.register_buffer(leaf, tensor, persistent=w.kind == Weight.BUFFER and w.persistent)
        # Not a submodule: its own attributes must not show up as the model's state.
        object.__setattr__(self, "_graph", graph_module)
        # Per placeholder: None for the next user input, else (is a parameter, path).
        self._order = [
            None if name not in weights
            else (weights[name][0].kind == Weight.PARAMETER, weights[name][0].fqn)
            for name in placeholders
        ]
        self._out_spec = out_spec

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        inputs = iter(pytree.tree_leaves((args, kwargs)))
        values = [
            next(inputs) if slot is None
            else self.get_parameter(slot[1]) if slot[0] else self.get_buffer(slot[1])
            for slot in self._order
        ]
        outputs = self._graph(*values)
        return pytree.tree_unflatten(list(outputs), self._out_spec)


def _hinted(sizes: Any) -> list[int]:
    return [int(s.hint) for s in sizes]


def _dims(meta: graph_pb2.TensorMeta, dims: dict[str, Any], name: str) -> dict[int, Any] | None:
    """The `dynamic_shapes` entry of one input: its dimensions that are a dynamic symbol."""
    found: dict[int, Any] = {}
    for i, size in enumerate(meta.shape):
        if size.expr.isdigit():
            continue
        if size.expr not in dims:
            raise ExportFailed(
                f"input {name} dimension {i} is {size.expr!r}: only plain dynamic dimensions "
                "(torch.export.Dim), not derived ones, can be exported through the farm"
            )
        found[i] = dims[size.expr]
    return found or None


def build_package(
    graph: graph_pb2.Graph,
    spec: farm_pb2.ExportSpec,
    inductor_options: dict[str, Any] | None = None,
) -> ExportResult:
    """Rebuilds the exported program and packages it with AOTInductor."""
    t0 = time.perf_counter()
    exportcheck.validate_export(graph, spec)
    decoded = decode_graph(graph)
    in_spec = pytree.treespec_loads(spec.in_spec)
    out_spec = pytree.treespec_loads(spec.out_spec)
    nodes = [n for n in graph.nodes if n.op == graph_pb2.Node.PLACEHOLDER]
    by_placeholder = {w.placeholder: w for w in spec.weights}
    weights = {
        n.name: (by_placeholder[n.name], weight_tensor(by_placeholder[n.name], _device(n.tensor)))
        for n in nodes
        if n.name in by_placeholder
    }
    symbols = {
        d.symbol: torch.export.Dim(d.symbol, min=d.min, **({"max": d.max} if d.max else {}))
        for d in spec.dims
    }
    examples, shapes = [], []
    for n in nodes:
        if n.name in weights:
            continue
        meta = n.tensor
        example = torch.empty_strided(
            _hinted(meta.shape), _hinted(meta.stride), dtype=getattr(torch, meta.dtype),
            device=_device(meta),
        ).zero_()
        examples.append(example)
        shapes.append(_dims(meta, symbols, n.name))
    args, kwargs = pytree.tree_unflatten(examples, in_spec)
    module = ExportedModule(decoded.gm, [n.name for n in nodes], weights, out_spec).eval()
    dynamic = None
    if any(s is not None for s in shapes):
        dyn_args, dyn_kwargs = pytree.tree_unflatten(shapes, in_spec)
        dynamic = {"args": dyn_args, **dyn_kwargs}
    t1 = time.perf_counter()
    try:
        program = torch.export.export(module, tuple(args), dict(kwargs), dynamic_shapes=dynamic)
    except Exception as e:  # noqa: BLE001 - torch.export reports with many exception types
        raise ExportFailed(f"torch.export of the rebuilt program failed: {type(e).__name__}: {e}") from e
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="torchfarm-export-") as tmp:
        path = os.path.join(tmp, "model.pt2")
        inductor_fixes.apply()
        try:
            # Packaging fills aot_inductor.metadata in place and leaves it so: patched,
            # the worker's config is put back for its later jobs.
            with checked_aot_sources(), resolve("inductor_config").patch({"aot_inductor.metadata": {}}):
                # AOTAutograd's settings (`functorch.`) are in the key; the export traced no backward.
                inductor, _ = farm_options.split_functorch(inductor_options or {})
                resolve("aoti_compile_and_package")(program, package_path=path, inductor_configs=inductor)
        except Exception as e:  # noqa: BLE001 - Inductor's errors have no common base
            raise ExportFailed(f"AOTInductor failed: {type(e).__name__}: {e}") from e
        with open(path, "rb") as f:
            package = f.read()
    t3 = time.perf_counter()
    log.info("export: %d weights, %d inputs, package %d bytes in %.1fs",
             len(weights), len(examples), len(package), t3 - t0)
    return ExportResult(package, {"decode": t1 - t0, "export": t2 - t1, "aoti": t3 - t2})


def _device(meta: graph_pb2.TensorMeta) -> torch.device:
    index = meta.device.index
    return torch.device(meta.device.type) if index < 0 else torch.device(meta.device.type, index)
