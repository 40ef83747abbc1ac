"""What the farm refuses by name, and why. Free of torch.

`scripts/gen_allowlist.py` leaves every name `denial` returns a reason for out of the
allow-list, and the surface test (tests/unit/test_surface.py) walks every target Dynamo
can put in a graph on the installed torch: each must be on the allow-list or have a
reason here. Refusals quote the reason, so a user reads why, not only that.

A name is matched as `torchfarm.fx.encode` writes it: a qualified name
("torch.random.seed", "torch.ops.aten._print.default"), a Tensor method or attribute
name ("storage"), or a wrapped numpy call ("numpy:torch._numpy.random.rand").
"""

from __future__ import annotations

_IO = "reads or writes files"
_STATE = "changes process-wide state"
_RNG = "touches the global random number generator state"
_CALLABLES = "runs or builds arbitrary callables"
_MEMORY = "exposes storage, pointers or foreign memory"
_PROTOCOL = "a Python protocol that leaves the tensor world (Dynamo specializes it away)"
_SPARSE = "sparse or nested layout internals: the format carries strided tensors only"
_NOT_CARRIED = "a higher-order op the farm does not carry: its arguments are not checked yet"

DENIED_PREFIXES: dict[str, str] = {
    "torch._C._set_": _STATE,
    "torch.set_": _STATE,
    "torch.hub.": "downloads from the network",
    "torch.serialization.": _IO,
    "torch.ops.load_library": "loads native libraries",
    "torch._ops.ops.load_library": "loads native libraries",
    "torch.profiler.": "profilers write traces",
    "torch.autograd.profiler.": "profilers write traces",
    "torch.ops.profiler.": "profilers write traces",
    "torch.distributed.": "process groups and the network",
    "torch.multiprocessing.": "starts processes",
    "torch.cuda.": "device management",
    "torch.utils.": "utilities with I/O, processes and hooks",
    "torch.jit.": "compiles and loads TorchScript",
    "torch.package.": _IO,
    "torch.random.": _RNG,
    "torch._numpy.random.": _RNG,
    "os.": "the operating system",
    "sys.": "the interpreter's state",
    "subprocess.": "starts processes",
    "socket.": "the network",
    "pickle.": "unpickles",
}
"""Qualified-name prefixes, whatever namespace lists them."""

_UNCACHEABLE = "AOTAutograd's cache does not take it, so no artifact of the graph can be serialized"

UNCACHEABLE_PREFIXES: dict[str, str] = {
    "numpy:torch._numpy._ndarray.ndarray.": _UNCACHEABLE,
    "numpy:_operator.": _UNCACHEABLE,
    "torch.nn.init.": _UNCACHEABLE,
    "torch._lobpcg.": _UNCACHEABLE,
}
"""Whole-name prefixes of calls torch 2.13's `check_node_safe` refuses
(tests/unit/test_cacheable.py): numpy methods and operators on ndarrays, as Dynamo wraps
them, among others."""

DENIED_NAMES: dict[str, str] = {
    **dict.fromkeys(("backward", "_backward"), "runs autograd outside the graph"),
    **dict.fromkeys(("set", "set_", "set_data", "is_set_to"), _MEMORY),
    **dict.fromkeys(("manual_seed", "seed", "initial_seed"), _RNG),
    **dict.fromkeys(
        ("handle_torch_function", "has_torch_function", "has_torch_function_unary",
         "has_torch_function_variadic", "boolean_dispatch", "assert_int_or_pair"),
        "dispatch helpers that call arbitrary code",
    ),
    **dict.fromkeys(("load", "save", "from_file"), _IO),
    **dict.fromkeys(("asarray", "frombuffer", "from_numpy", "numpy", "tolist"), _MEMORY),
    **dict.fromkeys(("apply_", "map_", "map2_", "as_subclass", "module_load", "reinforce"), _CALLABLES),
    "new": "the legacy constructor takes storages and buffers",
    **dict.fromkeys(("attrgetter", "itemgetter", "methodcaller", "call"), _CALLABLES),
    "delitem": "mutates a Python container",
    **dict.fromkeys(("factorial", "comb", "perm"), "unbounded time on a large integer"),
}
"""Last components of a qualified name (an op's name for `torch.ops`), or method names."""

DENIED_PARTS: dict[str, str] = {
    "storage": _MEMORY,
    "data_ptr": _MEMORY,
    "hook": "registers hooks that run arbitrary code",
    "pin_memory": _MEMORY,
    "is_pinned": _MEMORY,
    "record_stream": "device stream management",
    "share_memory": _MEMORY,
    "is_shared": _MEMORY,
    "retain_grad": "changes autograd state outside the graph",
    "dlpack": _MEMORY,
    "seed": _RNG,
    "rng_state": _RNG,
    "print": "writes to the worker's output",
    "plan_cache": "device plan caches are process-wide state",
    "from_file": _IO,
}
"""Substrings of a name's last component."""

DENIED_TARGETS: dict[str, str] = {
    "torch.amp.autocast_mode.autocast": "a context manager: Dynamo records _enter_autocast and _exit_autocast",
    "torch._dynamo.utils.numpy_attr_wrapper": "reads an attribute named by a string",
    **{
        f"torch.ops.higher_order.{name}": why
        for names, why in (
            (("_export_tracepoint", "run_const_graph", "strict_mode", "wrap_with_autocast",
              "wrap_with_set_grad_enabled"), "made by torch.export, not by Dynamo"),
            (("aoti_call_delegate", "executorch_call_delegate", "inductor_compiled_code"),
             "runs a program compiled elsewhere"),
            (("call_torchbind",), "calls a method of a native object"),
            (("dynamo_bypassing_wrapper", "flat_apply", "invoke_leaf_function", "custom_function_call"),
             _CALLABLES),
            (("graphsafe_run_with_rng_state", "run_and_save_rng_state", "run_with_rng_state",
              "run_dtensor_rng_op"), _RNG),
            (("inline_asm_elementwise",), "runs inline assembly"),
            (("triton_kernel_wrapper_functional", "triton_kernel_wrapper_mutation"),
             "runs a user's Triton kernel source"),
            (("print", "with_effects"), "side effects outside the graph"),
            (("auto_functionalized", "auto_functionalized_v2", "flex_attention_backward", "trace_wrapped",
              "control_deps"),
             "made after Dynamo (functionalization, backward, compiled autograd, Inductor's passes)"),
            (("associative_scan", "scan", "map_impl", "while_loop_stack_output", "foreach_map",
              "hints_wrapper", "invoke_quant", "invoke_quant_packed", "local_map_hop", "out_dtype",
              "wrap_activation_checkpoint"), _NOT_CARRIED),
        )
        for name in names
    },
}
"""Whole names."""


DENIED_METHODS: dict[str, str] = {
    **dict.fromkeys(
        ("__array__", "__array_wrap__", "__bool__", "__complex__", "__contains__", "__deepcopy__",
         "__float__", "__format__", "__index__", "__int__", "__len__", "__long__", "__nonzero__",
         "__reduce_ex__", "__repr__", "__reversed__", "__setstate__"),
        _PROTOCOL,
    ),
    "_clear_non_serializable_cached_data": "changes the tensor's Python state",
    **dict.fromkeys(
        ("_coalesced_", "_dimI", "_dimV", "_indices", "_nnz", "_values", "_to_dense",
         "_sparse_mask_projection", "_nested_tensor_size", "_nested_tensor_strides",
         "_nested_tensor_storage_offsets"),
        _SPARSE,
    ),
}
"""Tensor methods a graph may not call (as ATen ops, where they are, a graph may)."""

DENIED_ATTRIBUTES: dict[str, str] = {
    **dict.fromkeys(
        ("data", "grad", "grad_fn", "grad_dtype", "output_nr", "retains_grad", "volatile", "_base",
         "_grad", "_grad_fn", "_version"),
        "autograd state outside the graph",
    ),
    "name": "named-tensor state",
    "_cdata": _MEMORY,
    "__cuda_array_interface__": _MEMORY,
}
"""Tensor attributes `builtins.getattr` may not read."""


def _inner(name: str) -> str:
    """The wrapped call of a numpy target ("numpy:torch._numpy._ufuncs.lcm")."""
    return name.partition(":")[2] or name


def denial(name: str, kind: str = "function") -> str | None:
    """Why the farm refuses the call target, method or attribute (`kind`) `name`; None
    if no rule names it."""
    if kind == "attribute" and name in DENIED_ATTRIBUTES:
        return DENIED_ATTRIBUTES[name]
    if kind == "method" and name in DENIED_METHODS:
        return DENIED_METHODS[name]
    if name in DENIED_TARGETS:
        return DENIED_TARGETS[name]
    for prefix, why in UNCACHEABLE_PREFIXES.items():
        if name.startswith(prefix):
            return why
    inner = _inner(name)
    for prefix, why in DENIED_PREFIXES.items():
        if inner.startswith(prefix):
            return why
    last = inner.rsplit(".", 1)[-1]
    if inner.startswith("torch.ops.") and inner.count(".") >= 3:
        last = inner.split(".")[3]  # torch.ops.<namespace>.<op>[.<overload>]
    if last in DENIED_NAMES:
        return DENIED_NAMES[last]
    for part, why in DENIED_PARTS.items():
        if part in last:
            return why
    return None
