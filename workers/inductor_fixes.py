"""Upstream Inductor bugs that make a compile wrong or endless, fixed in the worker before
it compiles.

An artifact from the farm must be as right as eager PyTorch, and the compile must end.
Where a torch release the farm serves miscompiles, or never finishes a compile, and the
upstream fix is small and understood, the worker carries that fix until the torch
builds it serves have it. Each fix names its upstream issue, checks that the code it
corrects is still there (`needed`), and changes nothing where it is not. Their names are
in the cache key (`torchfarm.wire.keys.INDUCTOR_FIXES`; a test holds the two lists
equal), so a farm that carries a fix never serves an artifact compiled without it.

A client's local `torch.compile` (and the SDK's local fallback) keeps the bug.

pytorch/pytorch#191837, CPU, torch 2.13: a vectorized 2-D tile kernel (`CppTile2DKernel`)
that scatters with `atomic_add`, as the backward of an advanced index does, offsets its
index by the tile's inner loop variable twice. `CppTile2DKernel.store` transforms the
index, then `CppVecKernel.store`'s parallel `atomic_add` path derives it again through
`ops.index_expr`, which `CppTile2DOverrides.index_expr` transforms once more. The kernel
writes out of bounds: wrong gradients and a corrupted heap (Falcon's multi-query
attention, `qkv[..., [-2], :]`, whose gradient was 1 to 3 % off in a local compile). The
fix passes that path the index untransformed, as upstream's does (pull request #191861).
With one thread and static threads the store is not atomic and was right. Torch 2.12
has the same code, and the fix applies there, but 2.12 fails to compile such a graph
earlier (it transposes a tile at an index computed inside the loop), which this leaves
as it is.

pytorch/pytorch#133734, CPU, torch 2.11, 2.12 and 2.13 (each one's source read): the
vector-range index analysis (`simplify_index_in_vec_range`, `stride_at`) runs
`sympy.simplify` over a whole index expression. A chain of views through reshapes and
slices (Funnel's relative-position shift) gives backward indices of over a thousand
operations; a local compile's backward had not finished after 17 minutes in that
analysis, and the farm's lowering hit the worker's time limit. Past `MAX_ANALYZED_OPS`
the analysis now answers without simplifying (upstream's open pull request #186319 drops
that simplify altogether): the index is left as it is, and its stride is the plain
difference, which is not a number, so the kernel takes the general (gathered,
untransposed) path for that access, as it does for any index whose stride it cannot
prove. Funnel's backward then lowered in under a minute, its gradients within 1e-7 of
eager.

pytorch/pytorch#185509, CPU, torch 2.13 (2.12 has the same code): when the scheduler
recomputes a node's loop body while it prepares a fusion
(`SchedulerNode.recompute_size_and_body`), it extracts the node's reads again but
renames them to the buffers that mutations wrote (`mutation_renames`) only if the node
also has fake dependencies. A node that reads a buffer a scatter mutated (the zeros an
`index_put` accumulates the backward of a bilinear upsample into) then reads the zeros:
it is fused into the kernel that writes them, before the scatter. A convolution whose
output is upsampled and also sampled (`grid_sample`) got a bias gradient of the two
channels' mean, 0.3 % off. The fix renames the recomputed reads whenever the node has
renames, as upstream's does (pull request #185873). 2.11's recompute keeps no renames
at all and compiled that graph right; the fix leaves it alone.

tests/unit/test_inductor_fixes.py compiles each bug's graph against eager.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchfarm.fx.internals import internal, resolve

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fix:
    name: str
    """The upstream issue: "pytorch/pytorch#191837"."""
    needed: Callable[[], bool]
    """Whether the running torch still has the bug's code."""
    apply: Callable[[], None]


def _tile2d_atomic_add_needed() -> bool:
    tile2d, vec = resolve("CppTile2DKernel"), resolve("CppVecKernel")
    try:
        tile_store = inspect.getsource(tile2d.store)
        vec_store = inspect.getsource(vec.store)
        overrides = inspect.getsource(resolve("CppTile2DOverrides").index_expr)
    except (OSError, TypeError):  # no source: the check cannot tell, and the code is left alone
        return False
    return (
        "atomic_add" not in tile_store
        and "self.transform_indexing(index)" in tile_store
        and "ops.index_expr(index" in vec_store
        and "transform_indexing" in overrides
    )


def _fix_tile2d_atomic_add() -> None:
    tile2d, vec = resolve("CppTile2DKernel"), resolve("CppVecKernel")
    cpp_config = resolve("inductor_config").cpp
    transformed_store = tile2d.store

    def store(self: Any, name: str, index: Any, value: Any, mode: Any = None) -> Any:
        parallel_atomic = mode == "atomic_add" and (cpp_config.dynamic_threads or self.num_threads != 1)
        if parallel_atomic and not self.need_vec_transpose(self.rename_indexing(index)):
            return vec.store(self, name, index, value, mode)  # its ops.index_expr transforms the index once
        return transformed_store(self, name, index, value, mode)

    store.__wrapped__ = transformed_store  # type: ignore[attr-defined]
    tile2d.store = store


MAX_ANALYZED_OPS = 200
"""Operations (`count_ops`) past which the vector-range index analysis does not simplify.
Model indices count tens; the expressions that stalled Funnel's compile, over a thousand."""


def _index_analysis_needed() -> bool:
    try:
        simplify_source = inspect.getsource(resolve("simplify_index_in_vec_range"))
        stride_source = inspect.getsource(resolve("stride_at"))
    except (OSError, TypeError):
        return False
    return "sympy.simplify(index)" in simplify_source and "sympy.simplify(new_index - index)" in stride_source


def analysis_module() -> Any:
    """The module that holds the vector-range index analysis: torch._inductor.sizevars
    (codegen/cpp.py before 2.13)."""
    where = internal("stride_at")
    assert where is not None
    return importlib.import_module(where.module)


def _bound_index_analysis() -> None:
    simplify_in_range, stride_at = resolve("simplify_index_in_vec_range"), resolve("stride_at")
    module = analysis_module()

    @functools.lru_cache
    def bounded_simplify_in_range(index: Any, var: Any, vec_length: int) -> Any:
        if index.count_ops() > MAX_ANALYZED_OPS:
            return index
        # Its recursion calls the module's name, which is this function now.
        return simplify_in_range.__wrapped__(index, var, vec_length)

    @functools.lru_cache
    def bounded_stride_at(index: Any, var: Any) -> Any:
        if index.has(var) and index.count_ops() > MAX_ANALYZED_OPS:
            return index.xreplace({var: var + 1}) - index  # what `stride_at` simplifies
        return stride_at.__wrapped__(index, var)

    # The module's own functions call these by its names (`stride_at_vec_range` both).
    setattr(module, "simplify_index_in_vec_range", bounded_simplify_in_range)  # noqa: B010
    setattr(module, "stride_at", bounded_stride_at)  # noqa: B010


def _recompute_renames_needed() -> bool:
    try:
        source = inspect.getsource(resolve("SchedulerNode.recompute_size_and_body"))
    except (OSError, TypeError):
        return False
    return "if fake_deps:" in source and ".rename(self.mutation_renames)" in source


def _rename_recomputed_reads() -> None:
    node_class = resolve("SchedulerNode")
    recompute = node_class.recompute_size_and_body
    dependencies = resolve("inductor_dependencies")
    fake = (dependencies.WeakDep, dependencies.StarDep)

    @functools.wraps(recompute)
    def recompute_size_and_body(self: Any, *args: Any, **kwargs: Any) -> None:
        fake_deps = any(isinstance(dep, fake) for dep in self.read_writes.reads)
        recompute(self, *args, **kwargs)
        if not fake_deps and self.mutation_renames:  # with fake deps, torch renamed them
            self.set_read_writes(self.read_writes.rename(self.mutation_renames))

    node_class.recompute_size_and_body = recompute_size_and_body


FIXES = (
    Fix("pytorch/pytorch#191837", _tile2d_atomic_add_needed, _fix_tile2d_atomic_add),
    Fix("pytorch/pytorch#133734", _index_analysis_needed, _bound_index_analysis),
    Fix("pytorch/pytorch#185509", _recompute_renames_needed, _rename_recomputed_reads),
)


@functools.cache
def apply() -> tuple[str, ...]:
    """Applies, once per process, every fix the running torch needs; returns their names.
    Called before any compile (workers/compiler.py)."""
    applied = []
    for fix in FIXES:
        if fix.needed():
            fix.apply()
            applied.append(fix.name)
    if applied:
        _tag_compile_caches(applied)
        log.info("Inductor fixes applied: %s", ", ".join(applied))
    return tuple(applied)


def _tag_compile_caches(applied: list[str]) -> None:
    """Puts the applied fixes in torch's own cache keys (`torch.compiler.config.
    cache_key_tag`, in Inductor's FX-graph and AOTAutograd keys): a worker whose disk
    cache holds graphs compiled before a fix (`torchfarm up`'s, the in-process
    executor's) compiles them again rather than load the unfixed kernels."""
    import torch.compiler.config as compiler_config

    tag = "torchfarm-inductor-fixes:" + ",".join(applied)
    current = compiler_config.cache_key_tag
    compiler_config.cache_key_tag = f"{current}|{tag}" if current else tag
