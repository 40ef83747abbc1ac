"""The features GPU users turn on, through the farm, where a CPU has them: bfloat16
models, bfloat16 autocast training, SDPA backends with and without dropout, and a
user's Triton kernels: a `torch.library.triton_op`, and the graph of a bare
`@triton.jit` call. `mode="reduce-overhead"`
is in test_parity.py, autocast around an MLP in test_global_state.py. The same features
on a GPU, with flash and memory-efficient attention, CUDA graphs and a bare
`@triton.jit` call: tests/targets/test_gpu_features.py.

Each compiles on the farm and matches eager within the tolerances a local
torch.compile meets here (the test checks that it does), or is refused by name. With
dropout, eager draws other random numbers than Inductor's kernels, so the farm is held
to a local torch.compile under the same seed instead.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

import sdk
from examples.models import TINY_GPT, make_gpt

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

BF16 = {"atol": 2e-2, "rtol": 2e-2}
"""bfloat16 has 8 bits of mantissa: a local compile's loss and grads stay within this of eager."""
BF16_GRADS = {"atol": 5e-2, "rtol": 5e-2}


def _farm_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sdk.backend" and "key=" in r.getMessage()]


def _step(compiled, model, inputs, autocast: bool = False):
    """One training step's loss and grads (the step itself left to the caller)."""
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with ctx:
        loss = compiled(*inputs)
    loss.float().backward()
    return loss.detach().float(), [p.grad.float() for p in model.parameters()]


def _local_and_farm(make, stack, *, autocast: bool = False, **compile_kwargs):
    """(eager, local torch.compile, farm) steps of three copies of one model."""
    model, inputs = make()
    copies = [copy.deepcopy(model) for _ in range(3)]
    torch._dynamo.reset()
    eager = _step(copies[0], copies[0], inputs, autocast)
    local = _step(torch.compile(copies[1], **compile_kwargs), copies[1], inputs, autocast)
    torch._dynamo.reset()
    farm = _step(sdk.compile(copies[2], remote=stack.address, fallback="error", **compile_kwargs),
                 copies[2], inputs, autocast)
    return eager, local, farm


def _assert_close(got, want, loss_tol, grad_tol):
    torch.testing.assert_close(got[0], want[0], **loss_tol)
    assert len(got[1]) == len(want[1])
    for g, w in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(g, w, **grad_tol)


def _bf16_gpt():
    model, inputs = make_gpt(TINY_GPT, batch=4)
    return model.to(torch.bfloat16), inputs


def test_a_bfloat16_model_trains_on_the_farm_within_what_a_local_compile_meets(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    eager, local, farm = _local_and_farm(_bf16_gpt, stack)
    assert _farm_lines(caplog), "compiled on the farm"
    assert all(g.dtype == torch.float32 for g in farm[1])  # upcast by _step; the params are bf16
    _assert_close(local, eager, BF16, BF16_GRADS)
    _assert_close(farm, eager, BF16, BF16_GRADS)


def test_bfloat16_autocast_training_of_the_gpt_matches_eager(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    eager, local, farm = _local_and_farm(lambda: make_gpt(TINY_GPT, batch=4), stack, autocast=True)
    assert _farm_lines(caplog), "compiled on the farm"
    _assert_close(local, eager, BF16, BF16_GRADS)
    _assert_close(farm, eager, BF16, BF16_GRADS)


class _Attention(torch.nn.Module):
    """Causal self-attention whose SDPA call drops out `p` of its weights in training."""

    def __init__(self, p: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.p, self.qkv, self.proj = p, torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, 2, 8).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, 16)).pow(2).mean()


def _attention(p: float):
    return lambda: (_Attention(p), (torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)),))


@pytest.mark.parametrize(("backend", "p"), [
    (None, 0.0), ("FLASH_ATTENTION", 0.0), ("MATH", 0.0), (None, 0.2), ("MATH", 0.2),
], ids=["default", "flash", "math", "default-dropout", "math-dropout"])
def test_sdpa_backends_with_and_without_dropout_train_as_a_local_compile_does(
    backend, p, stack, client_cache_dir, caplog
):
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    caplog.set_level(logging.INFO, logger="sdk")
    model, inputs = _attention(p)()
    results = []
    for compile_fn in (None, torch.compile, lambda m: sdk.compile(m, remote=stack.address, fallback="error")):
        m = copy.deepcopy(model)
        torch._dynamo.reset()
        torch.manual_seed(7)  # dropout's masks: the same seed for the local and the farm's kernels
        with sdpa_kernel([getattr(SDPBackend, backend)]) if backend else nullcontext():
            results.append(_step(compile_fn(m) if compile_fn else m, m, inputs))
    eager, local, farm = results
    assert _farm_lines(caplog), "compiled on the farm"
    exact = {"atol": 1e-5, "rtol": 1e-5}
    if p == 0.0:
        _assert_close(local, eager, exact, {"atol": 1e-4, "rtol": 1e-4})
        _assert_close(farm, eager, exact, {"atol": 1e-4, "rtol": 1e-4})
    else:
        assert not torch.allclose(local[0], _step(model, model, inputs)[0]), "dropout changed nothing"
        _assert_close(farm, local, exact, {"atol": 1e-5, "rtol": 1e-5})


@pytest.mark.parametrize(("backend", "p"), [("EFFICIENT_ATTENTION", 0.0), ("FLASH_ATTENTION", 0.2)],
                         ids=["efficient", "flash-dropout"])
def test_sdpa_kernels_a_cpu_lacks_fail_as_a_local_compile_does(backend, p, stack, client_cache_dir):
    """The CPU has no memory-efficient kernel, and its flash kernel takes no dropout:
    eager and a local torch.compile raise, and the farm's path raises torch's own error
    as the local compile does, not a farm error."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model, inputs = _attention(p)()
    raised = []
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        with pytest.raises(RuntimeError):
            model(*inputs)
        for compile_fn in (torch.compile, lambda m: sdk.compile(m, remote=stack.address, fallback="error")):
            torch._dynamo.reset()
            with pytest.raises(Exception) as e:  # noqa: PT011 (the local compile's error, whichever)
                compile_fn(copy.deepcopy(model))(*inputs)
            raised.append(e.value)
    local, farm = raised
    assert not isinstance(farm, sdk.FarmError), farm
    assert (type(farm), str(farm)) == (type(local), str(local))


@pytest.fixture(scope="module")
def triton_add_op():
    """A `torch.library.triton_op` calling a Triton kernel, with a CPU kernel beside it
    (a CPU cannot run Triton's)."""
    triton = pytest.importorskip("triton")
    from torch.library import triton_op, wrap_triton

    from tests.targets.kernels.add_kernel import add_kernel

    @triton_op("tf_gpu_features::add", mutates_args=())
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        wrap_triton(add_kernel)[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), BLOCK=64)
        return out

    add.register_kernel("cpu")(lambda x, y: x + y)
    add.register_autograd(lambda ctx, grad: (grad, grad))
    return add


class _UsesOp(torch.nn.Module):
    def __init__(self, op) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.op, self.lin = op, torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(self.lin(x), x).tanh().pow(2).mean()


def test_a_triton_op_runs_on_the_farm_and_matches_eager(triton_add_op, stack, client_cache_dir, caplog):
    """A local torch.compile traces into a triton_op and fails here (Triton has no CPU
    driver); the farm's worker keeps it a call of the op (torchfarm/fx/torch_library.py),
    which runs the CPU kernel registered beside it."""
    caplog.set_level(logging.INFO, logger="sdk")
    model, x = _UsesOp(triton_add_op), torch.randn(4, 8)
    torch._dynamo.reset()
    with torch.no_grad():
        got = sdk.compile(model, remote=stack.address, fallback="error")(x)
        want = model(x)
    assert _farm_lines(caplog), "compiled on the farm"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_training_through_a_triton_op_is_refused_by_name(triton_add_op, stack, client_cache_dir):
    """Its backward is the client's Python, which a worker runs only from a module its
    operator installed: the error names the op and the setting that would serve it."""
    model, x = _UsesOp(triton_add_op), torch.randn(4, 8)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"tf_gpu_features\.add.*needs its backward") as e:  # noqa: PT011
        sdk.compile(model, remote=stack.address, fallback="error")(x)
    assert "TORCHFARM_INSTALLED_OP_MODULES=tf_gpu_features=" in str(e.value)
    assert isinstance(e.value.__cause__ or e.value.inner_exception, sdk.RemoteCompileError)


def test_training_through_a_triton_op_runs_the_op_eagerly_and_the_rest_on_the_farm(
    triton_add_op, stack, client_cache_dir, caplog,
):
    """With fallback="local" the farm's refusal names the op, and the SDK splits the
    graph at its call (sdk/split.py): the op runs here with its own autograd, the linear
    before it and the loss after it compile on the farm, and the step matches eager."""
    caplog.set_level(logging.INFO, logger="sdk")
    model, twin, x = _UsesOp(triton_add_op), _UsesOp(triton_add_op), torch.randn(4, 8)  # seeded alike
    torch._dynamo.reset()
    loss = sdk.compile(model, remote=stack.address, fallback="local")(x)
    loss.backward()
    want = twin(x)
    want.backward()
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    for got, ref in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(got.grad, ref.grad, atol=1e-4, rtol=1e-4)
    lines = [r.getMessage() for r in caplog.records if r.name == "sdk.backend"]
    split = [l for l in lines if "call(s) the farm refuses run eagerly" in l]
    assert len(split) == 1, lines
    assert "(add_default: custom op torch.ops.tf_gpu_features.add.default needs its backward" in split[0], lines
    assert len(_farm_lines(caplog)) == 2, lines
    assert not [l for l in lines if "compiled locally" in l], lines


def _bare_triton_call_graph():
    """The graph Dynamo captures on a GPU for `add_kernel[grid](x, y, out, n, BLOCK=64)`
    in a model: a triton_kernel_wrapper_mutation node. A CPU's Dynamo does not capture
    the call (Triton has no CPU driver), so it is built here as Dynamo builds it."""
    pytest.importorskip("triton")
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_mutation

    from tests.targets.kernels.add_kernel import add_kernel

    x, y = torch.randn(100), torch.randn(100)
    g = torch.fx.Graph()
    px, py = g.placeholder("x"), g.placeholder("y")
    px.meta["example_value"], py.meta["example_value"] = x, y
    out = g.call_function(torch.empty_like, (px,))
    out.meta["example_value"] = torch.empty_like(x)
    g.call_function(triton_kernel_wrapper_mutation, (), {
        "kernel_idx": kernel_side_table.add_kernel(add_kernel),
        "constant_args_idx": kernel_side_table.add_constant_args({"n": 100, "BLOCK": 64}),
        "grid": [(2, 1, 1)], "tma_descriptor_metadata": {},
        "kwargs": {"x_ptr": px, "y_ptr": py, "out_ptr": out},
    })
    g.output((out,))
    return torch.fx.GraphModule({}, g), [x, y]


def test_a_bare_triton_kernel_call_is_refused_by_name(stack, client_cache_dir):
    """The SDK refuses it before sending it, naming the op and why (torchfarm/graph/denylist.py);
    with fallback="local" the graph's line says the same (tests/targets/test_gpu_features.py
    runs that on a GPU, where the local compile can then run the kernel)."""
    import dataclasses

    from sdk.backend import FarmBackend
    from sdk.settings import SDKSettings
    from torchfarm.settings import from_env

    gm, inputs = _bare_triton_call_graph()
    settings = dataclasses.replace(from_env(SDKSettings), remote=stack.address, fallback="error")
    with pytest.raises(sdk.GraphRejected) as e:
        FarmBackend(settings, name="user kernel")(gm, inputs)
    assert "'torch.ops.higher_order.triton_kernel_wrapper_mutation'" in str(e.value)
    assert "runs a user's Triton kernel source" in str(e.value)
