"""torchfarm/fx/global_state.py: the grad mode, autocast and SDPA backends a graph was
captured under, written into its request on the client and put back around the
worker's compile."""

from __future__ import annotations

import pytest
import torch

from torchfarm.fx import global_state, internals
from torchfarm.v1 import farm_pb2
from torchfarm.wire.options import SDPA_BACKENDS, OptionNotAllowed


def _recorded() -> farm_pb2.CompileOptions:
    options = farm_pb2.CompileOptions()
    global_state.record(options)
    return options


def test_record_then_applied_gives_back_the_callers_state():
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        options = _recorded()
    assert options.no_grad and [(a.device_type, a.dtype) for a in options.autocast] == [("cpu", "bfloat16")]
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    with global_state.applied(options):
        assert not torch.is_grad_enabled() and torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")


def test_the_default_state_records_nothing():
    options = _recorded()
    assert not options.no_grad and not options.autocast and not options.sdpa_backends


def test_torchs_default_sdpa_backends_are_the_farms():
    """What a fresh process has enabled, by priority: a request sends these as none."""
    from torch.nn.attention import _cur_sdpa_kernel_backends

    assert tuple(b.name for b in _cur_sdpa_kernel_backends(with_priority=True)) == SDPA_BACKENDS


def test_sdpa_kernel_around_the_call_is_recorded_and_applied_in_its_priority():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], set_priority=True):
        options = _recorded()
    assert list(options.sdpa_backends) == ["MATH", "FLASH_ATTENTION"]
    assert global_state.sdpa_backends_now() == []
    with global_state.applied(options):
        assert global_state.sdpa_backends_now() == ["MATH", "FLASH_ATTENTION"]
        assert not torch.backends.cuda.mem_efficient_sdp_enabled()
        keyed = internals.resolve("inductor_config").post_grad_custom_post_pass
        assert keyed.uuid() == "torchfarm-sdpa-backends:MATH,FLASH_ATTENTION"
    assert global_state.sdpa_backends_now() == [] and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert internals.resolve("inductor_config").post_grad_custom_post_pass is None


def test_autocast_for_a_device_this_machine_lacks_still_applies():
    """A CPU worker lowering for CUDA: torch.autocast("cuda") would turn itself off here."""
    options = farm_pb2.CompileOptions(autocast=[farm_pb2.Autocast(device_type="cuda", dtype="float16")])
    before = torch.get_autocast_dtype("cuda")
    with global_state.applied(options):
        assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.float16
    assert not torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == before


def test_an_unknown_autocast_is_refused_before_anything_changes():
    options = farm_pb2.CompileOptions(no_grad=True, autocast=[farm_pb2.Autocast(device_type="cpu", dtype="int8")])
    with pytest.raises(OptionNotAllowed, match="int8"), global_state.applied(options):
        pass
    assert torch.is_grad_enabled()


@pytest.mark.slow  # a real compile
def test_a_graph_that_never_leaves_its_vmap_level_leaves_the_worker_as_it_was():
    """Decoding puts back what a graph's helper calls change (torchfarm/fx/decode.py);
    the compile runs them again. A hostile graph that enters a vmap level and never
    leaves it would leave the worker thread inside vmap for the next tenant's jobs."""
    import contextlib

    from workers.compiler import CompileFailed, compile_graph
    from workers.fakepg import decoded

    graph = _captured_without(lambda x: torch.vmap(torch.sin)(x) + 1, ("_vmap_decrement_nesting",), (3, 4))
    depth = internals.resolve("functorch_depth")
    with global_state.applied(farm_pb2.CompileOptions()):
        graph_in = decoded(graph)
        assert depth() == 0
        with contextlib.suppress(CompileFailed):
            compile_graph(graph_in.gm, graph_in.example_inputs, fake_mode=graph_in.fake_mode)
    assert depth() == 0


def _captured_without(fn, leave_out: tuple[str, ...], shape: tuple[int, ...] = (4, 3)):
    """The graph Dynamo captures of `fn` on an input of `shape`, without the calls
    `leave_out` names (one each): what a hostile client would send."""
    from tests.graphs import captured_graph

    try:
        graph = captured_graph(fn, torch.randn(*shape))
    finally:
        torch._dynamo.reset()
    kept = [n for n in graph.nodes if not (leave_out and n.target.endswith(leave_out))]
    assert len(kept) == len(graph.nodes) - len(leave_out)
    del graph.nodes[:]
    graph.nodes.extend(kept)
    return graph


def _compiled_on_a_worker_whatever_fails(graph) -> None:
    """Decodes and compiles `graph` as a worker's job does; either may fail, and what the
    graph changed must not stay."""
    import contextlib

    from workers.compiler import CompileFailed, compile_graph
    from workers.fakepg import decoded

    with global_state.applied(farm_pb2.CompileOptions()):
        with contextlib.suppress(Exception):
            graph_in = decoded(graph)
            with contextlib.suppress(CompileFailed):
                compile_graph(graph_in.gm, graph_in.example_inputs, fake_mode=graph_in.fake_mode)


def _compiles_on_a_worker(graph) -> None:
    from workers.compiler import compile_graph
    from workers.fakepg import decoded

    with global_state.applied(farm_pb2.CompileOptions()):
        graph_in = decoded(graph)
        assert compile_graph(graph_in.gm, graph_in.example_inputs, fake_mode=graph_in.fake_mode).payload
    assert internals.resolve("functorch_depth")() == 0


def _grad_graph(leave_out: tuple[str, ...]):
    """`torch.func.grad` inside the compiled code, without the calls `leave_out` names."""
    return _captured_without(lambda x: torch.func.grad(lambda t: t.sin().pow(2).sum())(x) * 2, leave_out)


@pytest.mark.slow  # a real compile
def test_a_graph_that_never_leaves_its_grad_level_leaves_the_worker_as_it_was():
    """A hostile graph that enters `torch.func.grad`'s level, switches saved-tensor hooks
    off and allows in-place requires_grad, and undoes none of it, would leave the next
    tenant's jobs inside a grad level, unable to save tensors for a hook."""
    graph = _grad_graph(("_grad_decrement_nesting", "_saved_tensors_hooks_enable"))
    allowing = [n for n in graph.nodes if n.target.endswith("set_inplace_requires_grad_allowed")]
    graph.nodes.remove(allowing[-1])  # the call that disallows it again: left allowed
    _compiled_on_a_worker_whatever_fails(graph)
    assert internals.resolve("functorch_depth")() == 0
    assert internals.resolve("saved_tensors_hooks_enabled")()
    assert not internals.resolve("inplace_requires_grad_allowed")()


@pytest.mark.slow  # a real compile
def test_torch_func_grad_inside_the_graph_compiles_on_the_worker():
    _compiles_on_a_worker(_grad_graph(()))


def test_forward_mode_state_a_failing_graph_leaves_is_put_back():
    """What `torch.func.jvp` and `torch.autograd.forward_ad` change, left changed by a
    graph that fails (or never undoes it): a jvp level, forward gradients off, and a dual
    level, which torch keeps one of for the whole process, so every later job's jvp
    would fail to enter its own ("Nested forward mode AD is not supported")."""
    from torch.autograd import forward_ad

    with pytest.raises(ZeroDivisionError), global_state.preserved():
        torch._C._functorch._jvp_increment_nesting()
        torch._C._set_fwd_grad_enabled(False)
        forward_ad.enter_dual_level()  # the process's level and forward_ad's own count of it
        _ = 1 / 0
    assert internals.resolve("functorch_depth")() == 0
    assert torch._C._is_fwd_grad_enabled()
    assert forward_ad._current_level == -1
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(torch.ones(2), torch.full((2,), 3.0))
        assert forward_ad.unpack_dual(dual.sin()).tangent.tolist() == pytest.approx([3 * 0.5403023] * 2)


def _jvp_graph(leave_out: tuple[str, ...], fwd_grad: bool = True):
    """`torch.func.jvp` inside the compiled code, without the calls `leave_out` names,
    each of its forward-gradient switches setting `fwd_grad`."""

    def f(x):
        return torch.func.jvp(lambda t: t.sin().pow(2), (x,), (torch.ones_like(x),))[1] * 2

    graph = _captured_without(f, leave_out)
    switches = [n for n in graph.nodes if n.target == "torch._C._set_fwd_grad_enabled"]
    assert len(switches) == 2
    for n in switches:
        n.args[0].bool_value = fwd_grad
    return graph


@pytest.mark.slow  # a real compile
def test_a_graph_that_never_leaves_its_jvp_or_dual_level_leaves_the_worker_as_it_was():
    """A hostile graph that enters `torch.func.jvp`'s level and a dual level, switches
    forward gradients off, and undoes none of it, would leave the next tenant's jobs
    inside a jvp level, unable to take a forward gradient or enter a dual level."""
    from torch.autograd import forward_ad

    _compiled_on_a_worker_whatever_fails(_jvp_graph(("_jvp_decrement_nesting", "_exit_dual_level"), fwd_grad=False))
    assert internals.resolve("functorch_depth")() == 0
    assert torch._C._is_fwd_grad_enabled()
    with forward_ad.dual_level():
        assert forward_ad.unpack_dual(forward_ad.make_dual(torch.ones(1), torch.ones(1)) * 2).tangent.item() == 2


@pytest.mark.slow  # a real compile
def test_torch_func_jvp_inside_the_graph_compiles_on_the_worker():
    _compiles_on_a_worker(_jvp_graph(()))
