"""Every Inductor setting, classified: carried to the farm, refused, or client-only.

A setting the user changed, globally (`torch._inductor.config.x = ...`) or per call
(`options=`), must either travel in the request and so enter the key (`options.ALLOWED`:
the worker applies it inside a config patch), or make that graph compile locally, said
in a log line (`REFUSED`, each with its reason, `data/inductor_refused.json`, written by
`scripts/gen_inductor_refused.py`). `CLIENT_ONLY` settings shape only the client's own
process (its caches, its compile pool) and no artifact, so they neither travel nor
refuse. `tests/unit/test_inductor_settings.py` walks the installed torch's config and
fails on any setting in none of the three.

Imports no torch: the coordinator and the worker check names with it.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from torchfarm.wire import options

REFUSED_RESOURCE = "data/inductor_refused.json"

CLIENT_ONLY: dict[str, str] = {
    "compile_threads": "the client's own compile pool; the worker sizes its own",
    "worker_start_method": "how the client starts its compile pool",
    "fx_graph_cache": "the client's local FX graph cache; the farm keys its own",
    "fx_graph_remote_cache": "the client's remote FX graph cache; the farm keys its own",
    "autotune_local_cache": "the client's local autotune cache",
    "autotune_remote_cache": "the client's remote autotune cache",
    "bundled_autotune_remote_cache": "the client's remote autotune cache",
    "force_disable_caches": "the client's own caches; the farm's cache is keyed on the request",
    "remote_gemm_autotune_cache": "the client's remote autotune cache",
    "non_blocking_remote_cache_write": "how the client writes its remote caches",
    "enable_caching_generated_triton_templates": "the client's in-process cache of generated templates",
    "quiesce_async_compile_pool": "when the client's compile pool idles",
    "quiesce_async_compile_time": "when the client's compile pool idles",
    "compile_worker_wait_timeout": "how long the client waits on its own compile pool",
    "disable_progress": "a progress bar in the client's terminal; the farm shows none",
    # torch's aoti_compile_and_package writes it into the process's config, in place,
    # and leaves it there: every later graph of the process was refused.
    "aot_inductor.metadata": "an AOTInductor package's metadata, which only packaging reads",
}
"""Settings that touch only the client's process, with why nothing needs to travel."""

_AUTOGRAD_CACHE = "the client's AOTAutograd cache; the farm keys its own"
FUNCTORCH_CLIENT_ONLY: dict[str, str] = {
    options.FUNCTORCH + name: why for name, why in {
        "enable_autograd_cache": _AUTOGRAD_CACHE,
        "enable_remote_autograd_cache": _AUTOGRAD_CACHE,
        "bundled_autograd_cache": _AUTOGRAD_CACHE,
        "autograd_cache_allow_custom_autograd_functions": _AUTOGRAD_CACHE,
        "autograd_cache_normalize_inputs": _AUTOGRAD_CACHE,
        "bypass_autograd_cache_key": _AUTOGRAD_CACHE,
        "force_autograd_cache": _AUTOGRAD_CACHE,
        "strict_autograd_cache": _AUTOGRAD_CACHE,
        "debug_partitioner": "the partitioner's log lines in the client",
        "visualize_memory_budget_pareto": "a plot the client would write",
        "memory_budget_pareto_dir": "where the client would write that plot",
        "torch_compile_graph_format": "how the client draws graphs",
    }.items()
}
"""AOTAutograd settings (`torch._functorch.config`) that touch only the client's
process. The farm carries those `options.ALLOWED` names (`functorch.` prefixed), and a
graph with any other changed compiles locally, named: its artifact would be compiled
without it."""


@functools.cache
def refused() -> dict[str, str]:
    """Setting name → why the farm refuses it."""
    text = resources.files("torchfarm").joinpath(REFUSED_RESOURCE).read_text()
    data = json.loads(text)
    assert isinstance(data, dict)
    return {str(k): str(v) for k, v in data.items()}


def classify(name: str) -> str:
    """"carried", "client-only", "refused", or "unknown" (a setting this list predates)."""
    if name in options.ALLOWED:
        return "carried"
    if name in CLIENT_ONLY or name in FUNCTORCH_CLIENT_ONLY:
        return "client-only"
    if name.startswith(options.FUNCTORCH):
        return "refused"
    if name in refused():
        return "refused"
    return "unknown"


def why_refused(name: str) -> str:
    """The reason a changed setting keeps its graph off the farm."""
    if name.startswith(options.FUNCTORCH):
        return "an AOTAutograd setting the farm does not carry"
    return refused().get(name) or "unknown to this torchfarm: a torch newer than its list of settings"
