"""Which compile options a client may send: an allow-list, checked without torch.

Inductor's config is a remote-code-execution surface when a stranger sets it:
`cpp.cxx` names the compiler binary the worker runs, `trace.debug_dir` where it writes,
and several options take callables or paths. `torch.compile` validates only names and
(for plain types) value types, so `{"cpp.cxx": [null, "/bin/sh"]}` passes it. The farm
therefore accepts only the modes `torch.compile` names and a fixed set of tuning knobs
with boolean or small integer values. The coordinator refuses anything else with
INVALID_ARGUMENT; the worker checks again before it compiles.
"""

from __future__ import annotations

import json

from torchfarm.graph.graph_errors import GraphError

MODES = frozenset({"", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"})
"""`torch.compile(mode=...)` values; "" is no mode."""

_BOOL = (bool,)
_INT = (int,)
_OPT_INT = (int, type(None))

ALLOWED: dict[str, tuple[type, ...]] = {
    # Modes expand to these (torch._inductor.list_mode_options).
    "max_autotune": _BOOL,
    "max_autotune_pointwise": _BOOL,
    "max_autotune_gemm": _BOOL,
    "coordinate_descent_tuning": _BOOL,
    "triton.cudagraphs": _BOOL,
    # Fusion, layout and codegen knobs: booleans and small integers only.
    "epilogue_fusion": _BOOL,
    "epilogue_fusion_first": _BOOL,
    "pattern_matcher": _BOOL,
    "aggressive_fusion": _BOOL,
    "shape_padding": _BOOL,
    "comprehensive_padding": _BOOL,
    "layout_optimization": _BOOL,
    "fallback_random": _BOOL,
    "split_reductions": _BOOL,
    "benchmark_kernel": _BOOL,
    "benchmark_fusion": _BOOL,
    "size_asserts": _BOOL,
    "nan_asserts": _BOOL,
    "debug_index_asserts": _BOOL,
    "conv_1x1_as_mm": _BOOL,
    "memory_planning": _BOOL,
    "allow_buffer_reuse": _BOOL,
    "inplace_buffers": _BOOL,
    "combo_kernels": _BOOL,
    "emulate_precision_casts": _BOOL,
    "keep_output_stride": _BOOL,
    "cpp.dynamic_threads": _BOOL,
    "triton.persistent_reductions": _BOOL,
    "triton.unique_kernel_names": _BOOL,
    "triton.autotune_pointwise": _BOOL,
    "cpp.simdlen": _OPT_INT,
    # The client's thread count: Inductor sizes parallel C++ kernels for it (sdk/backend.py).
    "cpp.threads": _INT,
    "cpp.min_chunk_size": _INT,
    "triton.max_tiles": _OPT_INT,
    "max_fusion_size": _INT,
    "unroll_reductions_threshold": _INT,
    "realize_reads_threshold": _INT,
    "max_pointwise_cat_inputs": _INT,
}
"""Option name → the JSON value types it may have."""

AUTOCAST_DEVICES = frozenset({"cpu", "cuda", "xpu", "mps", "hpu"})
"""Device types a request may have autocast on for (torch.autocast's)."""
AUTOCAST_DTYPES = frozenset({"bfloat16", "float16"})
"""The lower precisions autocast casts to."""

SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION", "OVERRIDEABLE")
"""torch's SDPBackend names, in its default priority order (all enabled by default)."""

MAX_INT_OPTION = 1 << 20
"""Integer options above this are refused (they are counts and sizes, never this big)."""
RANGES: dict[str, tuple[int, int]] = {
    # A team of this many OpenMP threads may run when the worker benchmarks a kernel.
    "cpp.threads": (1, 1024),
}
"""Integer options with tighter bounds than MAX_INT_OPTION, inclusive."""


class OptionNotAllowed(GraphError):
    """A compile mode or Inductor option the farm does not take from clients."""


def check_options(mode: str, options: list[tuple[str, str]]) -> dict[str, object]:
    """Validates (name, JSON value) pairs and the mode; returns the decoded options."""
    if mode not in MODES:
        raise OptionNotAllowed(f"compile mode {mode!r} is not one the farm accepts")
    decoded: dict[str, object] = {}
    for name, raw in options:
        kinds = ALLOWED.get(name)
        if kinds is None:
            raise OptionNotAllowed(f"Inductor option {name!r} is not on the farm's allow-list")
        if name in decoded:
            raise OptionNotAllowed(f"Inductor option {name!r} given twice")
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise OptionNotAllowed(f"Inductor option {name!r}: value is not JSON") from e
        # bool is an int in Python: an int option must not take true, nor a bool option 1.
        ok = type(value) in kinds
        if ok and type(value) is int:
            low, high = RANGES.get(name, (-MAX_INT_OPTION, MAX_INT_OPTION))
            ok = low <= value <= high
        if not ok:
            raise OptionNotAllowed(f"Inductor option {name!r}: value {raw[:40]!r} is not allowed")
        decoded[name] = value
    return decoded


def check_sdpa_backends(names: list[str]) -> list[str]:
    """Validates the SDPA backends a graph was captured under: known, each once, and not
    torch's default, which a request leaves empty (so its key is unchanged)."""
    for name in names:
        if name not in SDPA_BACKENDS:
            raise OptionNotAllowed(f"SDPA backend {name[:40]!r} is not one torch has")
    if len(set(names)) != len(names):
        raise OptionNotAllowed("an SDPA backend given twice")
    if tuple(names) == SDPA_BACKENDS:
        raise OptionNotAllowed("the default SDPA backends are sent as none")
    return names


def check_autocast(entries: list[tuple[str, str]]) -> dict[str, str]:
    """Validates the (device type, dtype) pairs of the autocast a graph was captured
    under; returns them by device type."""
    found: dict[str, str] = {}
    for device, dtype in entries:
        if device not in AUTOCAST_DEVICES:
            raise OptionNotAllowed(f"autocast for device type {device[:40]!r} is not one the farm knows")
        if dtype not in AUTOCAST_DTYPES:
            raise OptionNotAllowed(f"autocast to {dtype[:40]!r} is not allowed; only {sorted(AUTOCAST_DTYPES)}")
        if device in found:
            raise OptionNotAllowed(f"autocast for {device!r} given twice")
        found[device] = dtype
    return found
