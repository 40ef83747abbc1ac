#!/usr/bin/env python
"""Generates `torchfarm/data/allowlist.json`, the farm's allow-list of graph targets.

    .venv/bin/python scripts/gen_allowlist.py          # rewrite the file
    .venv/bin/python scripts/gen_allowlist.py --check  # exit 1 if it is stale

The list is built from the pinned torch by enumerating namespaces of pure tensor ops,
then removing a deny-list of anything that does I/O, touches storage or pointers,
changes process-wide state, registers hooks or runs arbitrary callables. Names are
canonical as `torchfarm.fx.encode.qualified_name` writes them, and every one is checked to resolve
back to the same object through `torchfarm.fx.decode.resolve_qualified_name`.

The output depends only on the installed torch, so a unit test regenerates it and
compares with the committed file.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch._inductor.inductor_prims  # noqa: E402,F401  registers the prims Inductor's decompositions emit

from torchfarm import collectives, dtensor, graphcheck  # noqa: E402
from torchfarm.fx.decode import resolve_qualified_name  # noqa: E402
from torchfarm.fx.encode import UnsupportedGraph, lookup_qualified_name, qualified_name  # noqa: E402

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

# Pure operator-module functions. attrgetter/itemgetter/methodcaller build callables and
# operator.call runs one, so they are left out.
OPERATOR_FUNCTIONS = (
    "abs add and_ concat contains eq floordiv ge getitem gt iadd iand iconcat ifloordiv "
    "ilshift imatmul imod imul index inv invert ior ipow irshift is_ is_not isub itruediv "
    "ixor le lshift lt matmul mod mul ne neg not_ or_ pos pow rshift setitem sub truediv "
    "truth xor"
).split()

# Factorials and binomials of a large int take unbounded time; everything else in math
# is a bounded pure function.
MATH_DENIED = {"factorial", "comb", "perm"}

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
    # `sdpa_kernel(...)` inside the compiled code; graphcheck checks the backend names
    # and that the second takes only nodes of the first.
    graphcheck.SDPA_BACKEND,
    graphcheck.SET_SDPA_KERNEL,
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

# Tensor attributes `builtins.getattr` may read: the public data descriptors of
# torch.Tensor, less these, which lead to autograd state or leave the tensor world.
DENIED_ATTRIBUTES = {"data", "grad", "grad_fn", "grad_dtype", "name", "output_nr", "retains_grad", "volatile"}

# Qualified-name prefixes that never enter the list, whatever namespace lists them:
# serialization and file I/O, library loading, hub downloads, global-state setters,
# profilers that write traces, process and device management.
DENIED_PREFIXES = (
    "torch._C._set_",
    "torch.set_",
    "torch.hub.",
    "torch.serialization.",
    "torch.ops.load_library",
    "torch._ops.ops.load_library",
    "torch.profiler.",
    "torch.autograd.profiler.",
    "torch.ops.profiler.",
    "torch.distributed.",
    "torch.multiprocessing.",
    "torch.cuda.",
    "torch.utils.",
    "torch.jit.",
    "torch.package.",
    "torch.random.",
    "os.",
    "sys.",
    "subprocess.",
    "socket.",
    "pickle.",
)

# Names (last component of a function, or a method name) that are never allowed.
DENIED_NAMES = {
    # process-wide state, autograd machinery, helpers that dispatch to arbitrary code
    "backward",
    "_backward",
    "set",
    "set_",
    "set_data",
    "is_set_to",
    "manual_seed",
    "seed",
    "initial_seed",
    "handle_torch_function",
    "has_torch_function",
    "has_torch_function_unary",
    "has_torch_function_variadic",
    "boolean_dispatch",
    "assert_int_or_pair",
    # I/O, buffers and foreign memory
    "load",
    "save",
    "asarray",
    "frombuffer",
    "from_numpy",
    "from_file",
    "numpy",
    "tolist",
    # Tensor methods that run callables, expose storage or leave the tensor world
    "apply_",
    "map_",
    "map2_",
    "as_subclass",
    "module_load",
    "new",
    "reinforce",
    "type",
}
# Substrings of a name that deny it.
DENIED_PARTS = (
    "storage",
    "data_ptr",
    "hook",
    "pin_memory",
    "is_pinned",
    "record_stream",
    "share_memory",
    "is_shared",
    "retain_grad",
    "dlpack",
    "seed",
    "rng_state",
    "print",
    "plan_cache",
    "from_file",
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


def denied(name: str) -> bool:
    if name.startswith(DENIED_PREFIXES):
        return True
    last = name.rsplit(".", 1)[-1]
    if name.startswith("torch.ops."):
        last = name.split(".")[3]  # torch.ops.<namespace>.<op>[.<overload>]
    return last in DENIED_NAMES or any(part in last for part in DENIED_PARTS)


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
    names.update(f"_operator.{n}" for n in OPERATOR_FUNCTIONS)
    names.update(
        f"math.{n}"
        for n in dir(math)
        if not n.startswith("_") and callable(getattr(math, n)) and n not in MATH_DENIED
    )
    names.update(HELPERS)
    # Functional collectives name their group by a string; torchfarm/collectives.py
    # checks it against the graph's declared groups.
    names.update(collectives.allowed_targets())
    # DTensor.from_local takes a mesh input and placements; torchfarm/dtensor.py checks them.
    names.update(dtensor.allowed_functions())
    names.update(HIGHER_ORDER_OPS)
    return sorted(names)


def methods() -> list[str]:
    public = [
        n
        for n in dir(torch.Tensor)
        if not n.startswith("_") and callable(getattr(torch.Tensor, n, None))
    ]
    return sorted({n for n in public if not denied(n)} | set(TENSOR_DUNDERS) | set(dtensor.METHODS))


def attributes() -> list[str]:
    public = [
        n
        for n in dir(torch.Tensor)
        if not n.startswith("_") and not callable(getattr(torch.Tensor, n, None))
    ]
    return sorted(n for n in public if n not in DENIED_ATTRIBUTES and not denied(n))


def verify(function_names: list[str]) -> None:
    """Every name must resolve, and name the object it resolves to."""
    for name in function_names:
        obj = resolve_qualified_name(name)
        if qualified_name(obj) != name:
            raise SystemExit(f"{name} resolves to an object named {qualified_name(obj)}")


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
