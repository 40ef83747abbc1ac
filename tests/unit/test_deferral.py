"""The staged pipeline's worker pieces, without servers: lowering with deferred kernel
builds (workers/deferral.py, `workers.compiler.lower_graph`), building one kernel spec
(`build_kernel`), and the kernel cache key (workers/board.py).

Torch 2.13 internals that workers/deferral.py relies on are pinned first. Numerics
against eager: rtol=1e-5, atol=1e-6, as tests/unit/test_compiler_loader.py.
"""

from __future__ import annotations

import copy
import inspect
import os
from pathlib import Path

import pytest
import torch

from examples.models import make_mlp
from torchfarm.fx.cpp_kernels import KernelSpec, spec_args
from torchfarm.fx.hooks import count_kernel_builds
from workers.board import kernel_cache_key
from workers.compiler import NeedsWholeGraph, build_kernel, compile_graph, lower_graph
from workers.deferral import DeferredKernelCalled, defer_kernel_builds

RTOL, ATOL = 1e-5, 1e-6
PROBE = 'extern "C" int torchfarm_probe() { return 7; }\n'
BINDING = "void kernel(long x) { (void)x; }\n"


@pytest.fixture
def fresh_inductor(tmp_path):
    from torch._inductor.utils import fresh_cache

    with fresh_cache(dir=str(tmp_path)):
        yield Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


# ---- torch internals (torch 2.13.0) -------------------------------------------------


def test_internals_the_deferral_patches():
    from torch._inductor import codecache

    assert isinstance(codecache.CppCodeCache.__dict__["load_async"], classmethod)
    assert callable(codecache._precompile_header)
    assert codecache.CppPythonBindingsCodeCache.entry_function == "kernel"
    assert isinstance(codecache.PyCodeCache.modules_no_attr, dict)
    assert isinstance(codecache.PyCodeCache.modules, list)
    # A stub must be a ModuleType: load_pybinding_async asserts exactly that.
    source = inspect.getsource(codecache.CppPythonBindingsCodeCache.load_pybinding_async)
    assert "isinstance(result, ModuleType)" in source


# ---- the deferral ------------------------------------------------------------------


def _mlp_graph():
    model, (x,) = make_mlp(batch=4)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(x)
    return model, x, graphs[0]


@pytest.mark.timeout(300)
def test_a_stub_call_is_caught_and_nothing_stays_patched(fresh_inductor):
    from torch._inductor import codecache
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    pick_vec_isa()  # the once-per-process ISA probe builds; not what this is about
    original = codecache.CppCodeCache.__dict__["load_async"]
    with count_kernel_builds() as builds, defer_kernel_builds() as loads:
        kernel = codecache.CppPythonBindingsCodeCache.load_pybinding(["long"], BINDING)
        with pytest.raises(DeferredKernelCalled):
            kernel(1)
    assert builds.kernels == []
    assert len(loads.records) == 1 and len(loads.stub_calls) == 1
    assert codecache.CppCodeCache.__dict__["load_async"] is original
    # The real loader stayed in the class cache: the same kernel now builds and runs
    # (the binding returns None; a stub would raise).
    with count_kernel_builds() as real:
        assert codecache.CppPythonBindingsCodeCache.load_pybinding(["long"], BINDING)(41) is None
    assert len(real.kernels) == 1


@pytest.mark.timeout(300)
def test_a_kernel_looked_up_by_name_is_a_stub_call_too(fresh_inductor):
    # max-autotune's C++ GEMM templates benchmark each candidate by its entry point's
    # name (CppBenchmarkRequest.make_run_fn: getattr(CppCodeCache.load(src), name)).
    from torch._inductor import autotune_process, codecache

    make_run_fn = inspect.getsource(autotune_process.CppBenchmarkRequest.make_run_fn)
    assert "CppCodeCache.load(" in make_run_fn and "getattr(self.DLL, self.kernel_name)" in make_run_fn
    with defer_kernel_builds() as loads:
        module = codecache.CppCodeCache.load(PROBE)
        with pytest.raises(DeferredKernelCalled):
            name = "cpp_CppMicroGemmFP32Vec_0"  # a template candidate's entry point
            getattr(module, name)()
        assert not hasattr(module, "__wrapped__")  # dunders stay Python's own
    assert len(loads.stub_calls) == 1


def test_lower_graph_hands_a_compile_that_runs_kernels_to_the_whole_path(monkeypatch, fresh_inductor):
    from torch._inductor import codecache

    def benchmarking_compile(gm, inputs, **kwargs):
        try:  # as an autotuner would: run a candidate, swallow its failure
            codecache.CppCodeCache.load(PROBE).kernel()  # AsyncCompile.cpp calls `kernel`
        except Exception:
            pass
        raise AssertionError("not reached: the stub call is reported first")

    model, x, (gm, inputs) = _mlp_graph()
    monkeypatch.setattr(torch._inductor, "standalone_compile", benchmarking_compile)
    with pytest.raises(NeedsWholeGraph):
        lower_graph(gm, inputs)


@pytest.mark.slow
def test_deferred_lowering_builds_nothing_and_names_what_deserialize_loads(tmp_path):
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    from torch._inductor.utils import fresh_cache

    pick_vec_isa()  # the once-per-process ISA probe builds; not what this is about
    model, x, (gm, inputs) = _mlp_graph()
    (tmp_path / "lower").mkdir()
    (tmp_path / "whole").mkdir()
    with fresh_cache(dir=str(tmp_path / "lower")):
        from torch._inductor import codecache

        streamed: list[bytes] = []
        with count_kernel_builds() as builds:
            lowered = lower_graph(gm, inputs, on_kernel=streamed.append)
        assert builds.kernels == [], "lowering ran the C++ compiler on a kernel"
        # What the compile asked for, as it asked (the staged path sends these builds
        # early), is what deserialize loads: so no build waits for the lowering to end.
        assert len(streamed) == len(set(streamed)) and set(streamed) == set(lowered.specs)
        # No loader made with the precompiled header stubbed out stays registered: the
        # kernel builds in this process must register their own, with the header.
        assert not codecache.CppCodeCache.cache
        assert not codecache.CppPythonBindingsCodeCache.cache
        assert lowered.specs
        built = [build_kernel(spec) for spec in lowered.specs]
        assert all(k.binary.startswith(b"\x7fELF") for k in built)
    # The specs are exactly the kernels the whole-graph path collects from deserialize.
    with fresh_cache(dir=str(tmp_path / "whole")):
        fresh = compile_graph(gm, inputs)
    assert sorted(k.source for k in fresh.kernels) == sorted(lowered.specs)


@pytest.mark.slow
def test_a_lowering_does_not_poison_the_next_compile_of_the_same_graph(tmp_path):
    from torch._inductor.utils import fresh_cache

    model, x, (gm, inputs) = _mlp_graph()
    eager = copy.deepcopy(model)
    with fresh_cache(dir=str(tmp_path)):
        lower_graph(gm, inputs)
        # The same graph through torch.compile's own Inductor, in this process and cache
        # dir: its FX-graph cache now holds the lowering's entry, whose wrapper module
        # was imported against stubs.
        torch._dynamo.reset()
        compiled = torch.compile(copy.deepcopy(model))
        out = compiled(x)
    torch.testing.assert_close(out, eager(x), rtol=RTOL, atol=ATOL)


# ---- kernel builds and the kernel cache key ----------------------------------------


def _spec(source: str = PROBE) -> bytes:
    args = spec_args({"main_code": source, "device_type": "cpu", "extra_flags": ()})
    return KernelSpec("CppCodeCache", args, output=0, outputs=1).to_bytes()


def test_build_kernel_builds_the_spec_with_the_local_inductor(fresh_inductor):
    from torch._inductor import codecache

    kernel = build_kernel(_spec())
    assert kernel.kind == "cpp" and kernel.binary.startswith(b"\x7fELF")
    with count_kernel_builds() as again:
        assert codecache.CppCodeCache.load(PROBE).torchfarm_probe() == 7
    assert again.kernels == [], "the kernel job's binary is not where Inductor looks"


def test_kernel_cache_key_covers_spec_target_and_build():
    build = {"torch_git": "abc", "compiler": "gcc 12", "isa": "avx2"}
    key = kernel_cache_key(_spec(), "cpu:avx2", build)
    assert key == kernel_cache_key(_spec(), "cpu:avx2", dict(reversed(build.items())))
    assert key != kernel_cache_key(_spec(PROBE + "// other\n"), "cpu:avx2", build)
    assert key != kernel_cache_key(_spec(), "cpu:avx512", build)
    assert key != kernel_cache_key(_spec(), "cpu:avx2", {**build, "compiler": "gcc 13"})
    assert key != kernel_cache_key(_spec(), "cpu:avx2", {**build, "torch_git": "abd"})
    # Scoped to a tenant, the key differs per tenant and from the fleet-wide one.
    alice = kernel_cache_key(_spec(), "cpu:avx2", build, tenant="alice")
    assert alice != key and alice != kernel_cache_key(_spec(), "cpu:avx2", build, tenant="bob")
