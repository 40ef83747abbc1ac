"""The features GPU users turn on, through a farm whose worker serves this GPU, on a
machine with a CUDA GPU only (skipped elsewhere by the `gpu` marker): bfloat16 models
and autocast, mode="reduce-overhead" (CUDA graphs), SDPA's flash and memory-efficient
kernels with and without dropout, and a user's Triton kernels, bare and as a
`torch.library.triton_op`. What a CPU can check of them runs everywhere:
tests/integration/test_gpu_features.py.

Each trains through the farm and matches eager within the tolerances a local
torch.compile meets (checked alongside), or is refused by name. With dropout the farm
is held to a local torch.compile under the same seed, as eager draws other numbers.
"""

from __future__ import annotations

import copy
import logging
from contextlib import nullcontext

import pytest
import torch
from torch._inductor import cudagraph_trees

import sdk
from examples.models import TINY_GPT, make_gpt
from localfarm.stack import LocalStack

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

FP32 = ({"atol": 1e-3, "rtol": 1e-3}, {"atol": 1e-2, "rtol": 1e-2})
"""Loss and grads against eager in float32 (Inductor reorders reductions; TF32 is off)."""
BF16 = ({"atol": 2e-2, "rtol": 2e-2}, {"atol": 5e-2, "rtol": 5e-2})
SAME_SEED = ({"atol": 1e-5, "rtol": 1e-5}, {"atol": 1e-4, "rtol": 1e-4})


@pytest.fixture(scope="module")
def gpu_stack(tmp_path_factory):
    stack = LocalStack(workers=1, workdir=tmp_path_factory.mktemp("gpu-features"),
                       extra_env={"TORCHFARM_SANDBOX": "auto", "TORCHFARM_TARGETS": "local"})
    stack.start(timeout_s=180)  # a GPU worker registers after its GPU check
    try:
        yield stack
    finally:
        stack.stop()


def _farm(model, stack, **kwargs):
    return sdk.compile(model, remote=stack.address, fallback="error", **kwargs)


def _farm_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sdk.backend" and "key=" in r.getMessage()]


def _train(compiled, model, inputs, steps: int = 3, autocast: bool = False):
    """Losses of `steps` SGD steps and the last step's grads, in float32."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = compiled(*inputs)
        loss.float().backward()
        losses.append(loss.detach().float().clone())  # CUDA graphs reuse their outputs
        grads = [p.grad.float().clone() for p in model.parameters()]
        opt.step()
    return torch.stack(losses), grads


def _runs(make, stack, compile_kwargs=None, seed=None, **train_kwargs):
    """(eager, local torch.compile, farm) training runs of three copies of one model."""
    model, inputs = make()
    model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    out = []
    for compile_fn in (None, torch.compile, lambda m, **kw: _farm(m, stack, **kw)):
        m = copy.deepcopy(model)
        torch._dynamo.reset()
        cudagraph_trees.reset_cudagraph_trees()  # so the farm's run records its own
        if seed is not None:
            torch.manual_seed(seed)
        out.append(_train(compile_fn(m, **(compile_kwargs or {})) if compile_fn else m, m, inputs, **train_kwargs))
    return out


def _assert_close(got, want, tolerances):
    loss_tol, grad_tol = tolerances
    torch.testing.assert_close(got[0], want[0], **loss_tol)
    for g, w in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(g, w, **grad_tol)


def _gpt():
    return make_gpt(TINY_GPT, batch=4)


def _bf16_gpt():
    model, inputs = _gpt()
    return model.to(torch.bfloat16), inputs


@pytest.fixture(autouse=True)
def _no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("case", ["bf16-model", "bf16-autocast", "reduce-overhead"])
def test_gpt_trains_on_the_farm_within_what_a_local_compile_meets(case, gpu_stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    if case == "bf16-model":
        eager, local, farm = _runs(_bf16_gpt, gpu_stack)
        tol = BF16
    elif case == "bf16-autocast":
        eager, local, farm = _runs(_gpt, gpu_stack, autocast=True)
        tol = BF16
    else:
        eager, local, farm = _runs(_gpt, gpu_stack, {"mode": "reduce-overhead"}, steps=4)
        tol = FP32
        manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
        assert manager is not None and manager.ids_to_funcs, "the farm's artifact ran without CUDA graphs"
    assert _farm_lines(caplog), "compiled on the farm"
    _assert_close(local, eager, tol)
    _assert_close(farm, eager, tol)


class _Attention(torch.nn.Module):
    def __init__(self, p: float, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.p = p
        self.qkv = torch.nn.Linear(64, 192, dtype=dtype)
        self.proj = torch.nn.Linear(64, 64, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, 4, 16).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, 64)).float().pow(2).mean()


@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION"])
@pytest.mark.parametrize("p", [0.0, 0.1], ids=["no-dropout", "dropout"])
def test_sdpa_kernels_with_and_without_dropout(backend, p, gpu_stack, client_cache_dir, caplog):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    caplog.set_level(logging.INFO, logger="sdk")
    dtype = torch.bfloat16 if backend == "FLASH_ATTENTION" else torch.float32  # flash takes half types
    x = torch.randn(2, 128, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    with sdpa_kernel([getattr(SDPBackend, backend)]) if backend else nullcontext():
        eager, local, farm = _runs(lambda: (_Attention(p, dtype), (x,)), gpu_stack, seed=7, steps=2)
    assert _farm_lines(caplog), "compiled on the farm"
    tol = BF16 if dtype == torch.bfloat16 else FP32
    if p == 0.0:
        _assert_close(local, eager, tol)
        _assert_close(farm, eager, tol)
    else:
        _assert_close(farm, local, SAME_SEED)


def _user_kernel_model():
    triton = pytest.importorskip("triton")
    from tests.targets.kernels.add_kernel import add_kernel

    class UsesKernel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.lin(x)
            out = torch.empty_like(h)
            add_kernel[(triton.cdiv(h.numel(), 256),)](h, x, out, h.numel(), BLOCK=256)
            return out.tanh().pow(2).mean()

    return UsesKernel().cuda(), (torch.randn(8, 64, device="cuda"),)


def test_a_bare_triton_kernel_is_refused_by_name(gpu_stack, client_cache_dir, caplog):
    """Dynamo captures a @triton.jit call as triton_kernel_wrapper_mutation, whose
    kernel source the farm does not compile (torchfarm/graph/denylist.py): with
    fallback="error" the error says so; with "local" the graph is split at the call
    (sdk/split.py), which runs eagerly, the layers around it compile on the farm, and
    the result is eager's."""
    model, inputs = _user_kernel_model()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="runs a user's Triton kernel source"):  # noqa: PT011
        _farm(copy.deepcopy(model), gpu_stack)(*inputs)
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="sdk"):
        got = sdk.compile(model, remote=gpu_stack.address, fallback="local")(*inputs)
    lines = [r.getMessage() for r in caplog.records if r.name == "sdk.backend"]
    assert any("run eagerly" in l and "Triton kernel source" in l for l in lines), lines
    assert len([l for l in lines if " key=" in l]) == 2, lines  # the linear, and tanh/pow/mean
    assert not [l for l in lines if "compiled locally" in l], lines
    torch.testing.assert_close(got, model(*inputs), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def triton_add_op():
    triton = pytest.importorskip("triton")
    from torch.library import triton_op, wrap_triton

    from tests.targets.kernels.add_kernel import add_kernel

    @triton_op("tf_gpu_targets::add", mutates_args=())
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        wrap_triton(add_kernel)[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
        return out

    add.register_autograd(lambda ctx, grad: (grad, grad))
    return add


def test_a_triton_op_runs_on_the_farm_or_is_refused_by_name(triton_add_op, gpu_stack, client_cache_dir, caplog):
    """Inference compiles on the farm and matches eager; training needs the op's
    backward, the client's Python, and is refused naming the op and the setting."""
    lin = torch.nn.Linear(64, 64).cuda()

    def f(x):
        return triton_add_op(lin(x), x).tanh()

    x = torch.randn(8, 64, device="cuda")
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="sdk"), torch.no_grad():
        torch.testing.assert_close(_farm(f, gpu_stack)(x), f(x), atol=1e-5, rtol=1e-5)
    assert _farm_lines(caplog), "compiled on the farm"
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"tf_gpu_targets\.add.*needs its backward"):  # noqa: PT011
        _farm(f, gpu_stack)(x).sum().backward()
    # With fallback="local" the graph is split at the op (sdk/split.py): it trains, the
    # op's Triton kernel launched here, the linear and the tanh on the farm.
    torch._dynamo.reset()
    x.requires_grad_(True)
    got = sdk.compile(f, remote=gpu_stack.address, fallback="local")(x)
    got.sum().backward()
    grad, x.grad = x.grad, None
    want = f(x)
    want.sum().backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, x.grad, atol=1e-4, rtol=1e-4)
