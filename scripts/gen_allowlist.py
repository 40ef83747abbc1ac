#!/usr/bin/env python
"""Generates `torchfarm/data/allowlist.json`, the farm's allow-list of graph targets.

    .venv/bin/python scripts/gen_allowlist.py          # rewrite the file
    .venv/bin/python scripts/gen_allowlist.py --check  # exit 1 if it is stale

The list is derived from the pinned torch: every target Dynamo can put in a graph
(`torchfarm/fx/surface.py`: torch's overridable functions and Tensor methods, the
builtins, numpy calls and higher-order ops Dynamo records, ATen and prims) and the
namespaces of pure tensor ops, less what `torchfarm/graph/denylist.py` refuses by name (I/O,
storage and pointers, process-wide state, RNG state, hooks, arbitrary callables). Names are
canonical as `torchfarm.fx.encode.qualified_name` writes them, and every one is checked to resolve
back to the same object through `torchfarm.fx.decode.resolve_qualified_name`.

The output depends only on the installed torch, so a unit test regenerates it and
compares with the committed file.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch._inductor.inductor_prims  # noqa: E402,F401  registers the prims Inductor's decompositions emit

from torchfarm.fx import surface  # noqa: E402
from torchfarm.fx.decode import resolve_target  # noqa: E402
from torchfarm.fx.encode import UnsupportedGraph, lookup_qualified_name, qualified_name  # noqa: E402
from torchfarm.graph import collectives, denylist, dtensor, graphcheck  # noqa: E402

OUTPUT = ROOT / "torchfarm" / "data" / "allowlist.json"

# Dispatcher namespaces whose ops are tensor ops: ATen, and PrimTorch's prims, which a
# decomposed graph (workers/aot_seam.py) holds beside core ATen.
DISPATCHER_NAMESPACES = ("aten", "prims")

# Namespaces whose public callables are tensor ops.
OP_NAMESPACES = (
    "torch._C._VariableFunctions",
    "torch._C._nn",
    "torch._C._linalg",
    "torch._C._fft",
    "torch._C._special",
    "torch.nn.functional",
    "torch.functional",
    "torch.fft",
    "torch.linalg",
    "torch.special",
)

# Namespaces that are bindings of ATen ops. Their private names (`torch._weight_norm`,
# which Wav2Vec2's weight norm calls) are ATen ops too, allowed as `torch.ops.aten.*`
# already; a private name is taken only if `torch.ops.aten` has an op of that name.
ATEN_BINDINGS = frozenset(
    {
        "torch._C._VariableFunctions",
        "torch._C._nn",
        "torch._C._linalg",
        "torch._C._fft",
        "torch._C._special",
    }
)

# Modules an enumerated op's canonical name may live in. Public namespaces re-export
# a few helpers from elsewhere (torch._jit_internal, torch._C._has_torch_function);
# those are not ops.
OP_MODULES = frozenset(
    {
        "torch",
        "torch._C._nn",
        "torch._C._linalg",
        "torch._C._fft",
        "torch._C._special",
        "torch.nn.functional",
        "torch.functional",
        "torch._lowrank",
    }
)

# Targets Dynamo emits for real models beyond plain ops (found by tracing no_grad,
# autocast, vmap, dynamic shapes, .item() and torch._check). Each is pure or restores
# the state it changes within the graph.
HELPERS = (
    "torch._C._set_grad_enabled",
    "torch.amp.autocast_mode._enter_autocast",
    "torch.amp.autocast_mode._exit_autocast",
    "torch.Size",
    "torch._assert",
    "torch._assert_async",
    "torch._check",
    "torch._check_is_size",
    "torch._check_index",
    "torch._check_value",
    "torch.sym_float",
    "torch.sym_int",
    "torch.sym_ite",
    "torch.sym_max",
    "torch.sym_min",
    "torch.sym_not",
    "torch.sym_sum",
    *(f"torch._sym_{f}" for f in "acos asin atan cos cosh log2 sin sinh sqrt tan tanh".split()),
    "torch._functorch.predispatch.lazy_load_decompositions",
    "torch._functorch.predispatch._vmap_increment_nesting",
    "torch._functorch.predispatch._vmap_decrement_nesting",
    "torch._functorch.predispatch._add_batch_dim",
    "torch._functorch.predispatch._remove_batch_dim",
    # `torch.func.grad` inside the compiled code.
    *graphcheck.FUNCTORCH_GRAD,
    # `torch.func.jvp` and forward-mode AD inside the compiled code.
    *graphcheck.FUNCTORCH_JVP,
    # `sdpa_kernel(...)` inside the compiled code; graphcheck checks the backend names
    # and that the second takes only nodes of the first.
    graphcheck.SDPA_BACKEND,
    graphcheck.SET_SDPA_KERNEL,
    # A jagged nested tensor made in the graph from a dense tensor and its offsets
    # (`torch.nested.nested_tensor_from_jagged`, `nested_from_padded`): Dynamo records
    # these constructors by name. AOTAutograd takes the nested tensor apart on the worker.
    "torch.nested._internal.nested_tensor.nested_from_padded",
    "torch.nested._internal.nested_tensor.nested_view_from_values_offsets",
    "torch.nested._internal.nested_tensor.nested_view_from_values_offsets_lengths",
    # `w.data` (Gemma 3n): an alias of the tensor, detached; AOTAutograd traces it to
    # `aten.detach`.
    "torch._C._autograd._get_data_attr",
    # Reads a Tensor attribute (`logits.T` in CLIP); graphcheck allows it only with a
    # node and a constant name from ATTRIBUTES, so it never reaches dunders or methods.
    "builtins.getattr",
)

# Higher-order ops Dynamo emits for activation checkpointing, autograd.Function, torch.cond,
# while_loop, flex_attention and nested_compile_region (`wrap`: a plain inlined body). Their
# callables are subgraphs of the same graph (graph.proto V2), which graphcheck validates
# with the same allow-list; every other `torch.ops.higher_order` op is refused by name.
HIGHER_ORDER_OPS = tuple(
    f"torch.ops.higher_order.{name}"
    for name in (
        "autograd_function_apply cond flex_attention invoke_subgraph tag_activation_checkpoint "
        "while_loop wrap"
    ).split()
)

# Dunder Tensor methods a graph may call: arithmetic, comparison and indexing.
TENSOR_DUNDERS = tuple(
    f"__{name}__"
    for name in (
        "abs add and div eq floordiv ge getitem gt iadd iand idiv ifloordiv ilshift imod imul "
        "invert ior ipow irshift isub itruediv ixor le lshift lt matmul mod mul ne neg or pos "
        "pow radd rand rdiv rfloordiv rlshift rmatmul rmod rmul ror rpow rrshift rshift rsub "
        "rtruediv rxor setitem sub truediv xor"
    ).split()
)


def denied(name: str, kind: str = "function") -> bool:
    return denylist.denial(name, kind) is not None


def _public_callables(namespace: str) -> Iterable[object]:
    ns = lookup_qualified_name(namespace)
    if ns is None:
        raise SystemExit(f"namespace {namespace} not found in this torch")
    private_ok = namespace in ATEN_BINDINGS
    for attr in sorted(dir(ns)):
        obj = getattr(ns, attr, None)
        if not inspect.isroutine(obj) or attr.startswith("__"):
            continue
        if not attr.startswith("_") or (private_ok and hasattr(torch.ops.aten, attr)):
            yield obj


def _dispatcher_ops() -> Iterable[object]:
    """ATen ops, and the PrimTorch prims that decompositions lower ATen ops to."""
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        ns, _, rest = full.partition("::")
        if ns not in DISPATCHER_NAMESPACES:
            continue
        op, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, ns), op, None)
        if packet is None:
            continue
        yield packet
        yield getattr(packet, overload or "default")


def functions() -> list[str]:
    names: set[str] = set()
    candidates: list[object] = []
    for namespace in OP_NAMESPACES:
        candidates.extend(_public_callables(namespace))
    candidates.extend(_dispatcher_ops())
    for obj in candidates:
        try:
            name = qualified_name(obj)
        except UnsupportedGraph:
            continue  # shadowed by a Python wrapper of the same name; Dynamo sees that one
        if (
            name.rsplit(".", 1)[0] in OP_MODULES
            or name.startswith(tuple(f"torch.ops.{ns}." for ns in DISPATCHER_NAMESPACES))
        ) and not denied(name):
            names.add(name)
    names.update(_surface(surface.FUNCTION))
    names.update(HELPERS)
    # Functional collectives name their group by a string; torchfarm/graph/collectives.py
    # checks it against the graph's declared groups.
    names.update(collectives.allowed_targets())
    # DTensor.from_local takes a mesh input and placements; torchfarm/graph/dtensor.py checks them.
    names.update(dtensor.allowed_functions())
    names.update(HIGHER_ORDER_OPS)
    return sorted(names)


def _surface(kind: str) -> set[str]:
    """What Dynamo can put in a graph as `kind`, less what the deny-list names."""
    found = set()
    for target in surface.surface():
        if target.kind != kind:
            continue
        if not target.encodable:
            raise SystemExit(f"the format cannot name {target.name}: see torchfarm/fx/encode.py")
        if not denied(target.name, kind):
            found.add(target.name)
    return found


def methods() -> list[str]:
    public = [
        n
        for n in dir(torch.Tensor)
        if not n.startswith("_") and callable(getattr(torch.Tensor, n, None))
    ]
    names = {n for n in public if not denied(n, surface.METHOD)} | _surface(surface.METHOD)
    return sorted(names | set(TENSOR_DUNDERS) | set(dtensor.METHODS))


def attributes() -> list[str]:
    public = [
        n
        for n in dir(torch.Tensor)
        if not n.startswith("_") and not callable(getattr(torch.Tensor, n, None))
    ]
    names = {n for n in public if not denied(n, surface.ATTRIBUTE)}
    return sorted(names | _surface(surface.ATTRIBUTE))


def verify(function_names: list[str]) -> None:
    """Every name must resolve, and name the object it resolves to."""
    for name in function_names:
        named = surface.name_of(resolve_target(name))
        if named.name != name:
            raise SystemExit(f"{name} resolves to an object named {named.name}")


def build() -> dict[str, object]:
    function_names = functions()
    verify(function_names)
    return {
        "torch_version": torch.__version__,
        "functions": function_names,
        "methods": methods(),
        "attributes": attributes(),
    }


def render(data: dict[str, object]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail if the committed file is stale")
    text = render(build())
    if parser.parse_args().check:
        stale = not OUTPUT.exists() or OUTPUT.read_text("utf-8") != text
        print(f"{OUTPUT} is {'stale' if stale else 'up to date'}")
        return int(stale)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, "utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
