"""Whatever Dynamo can put in a graph, the format carries or refuses by name (issue 43).

The walk (torchfarm/fx/surface.py) runs on the installed torch, whichever supported
build that is; each target must be nameable by the encoder and either on the allow-list
or refused by a rule of torchfarm/graph/denylist.py. Then the constructs real models were
refused for, each through encode and decode.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from torchfarm.fx import surface
from torchfarm.fx.decode import decode_graph
from torchfarm.fx.encode import UnsupportedGraph, encode_graph
from torchfarm.graph import allowlist, denylist


def _allowed(target: surface.Target) -> bool:
    lists = allowlist.load_allowlist()
    names = {surface.FUNCTION: lists.functions, surface.METHOD: lists.methods,
             surface.ATTRIBUTE: lists.attributes}[target.kind]
    return target.name in names


def test_every_target_dynamo_can_record_is_carried_or_denied_by_name() -> None:
    targets = surface.surface()
    # The walk is the whole surface, not a sample: torch declares about 1,400
    # overridable functions and methods, ATen some 3,000 ops with their overloads.
    assert len(targets) > 5_000
    # The allow-list is made from the pinned build: on another, a target it does not
    # name is refused by name, so only encodability is asked of that build's surface.
    pinned = allowlist.load_allowlist().torch_version == torch.__version__
    neither = [
        f"{t.kind} {t.name}" + ("" if t.encodable else " (the format cannot name it)")
        for t in targets
        if not t.encodable or (pinned and not (_allowed(t) or denylist.denial(t.name, t.kind)))
    ]
    assert neither == []


@pytest.mark.parametrize("kind", [surface.FUNCTION, surface.METHOD, surface.ATTRIBUTE])
def test_the_walk_reaches_each_kind(kind: str) -> None:
    assert any(t.kind == kind for t in surface.surface())


def test_higher_order_ops_are_each_allowed_or_denied_with_a_reason() -> None:
    hops = [t for t in surface.higher_order_ops()]
    assert any(t.name == "torch.ops.higher_order.tag_activation_checkpoint" for t in hops)
    for t in hops:
        assert _allowed(t) or denylist.denial(t.name), t.name


@pytest.mark.parametrize(
    "name, reason",
    [
        ("torch.random.seed", "random number generator"),
        ("torch.manual_seed", "random number generator"),
        ("numpy:torch._numpy.random.rand", "random number generator"),
        ("torch.ops.higher_order.triton_kernel_wrapper_mutation", "Triton"),
        ("torch.ops.higher_order.print", "side effects"),
        ("torch.save", "files"),
    ],
)
def test_a_refusal_says_why(name: str, reason: str) -> None:
    assert not allowlist.is_allowed_function(name)
    assert reason in allowlist.refusal(name)


def _round_trip(fn: Any, *args: Any, dynamic: bool | None = None) -> list[str]:
    """Encodes and decodes every graph of `fn`; the refusals, if any."""
    problems: list[str] = []
    graphs = 0

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        nonlocal graphs
        graphs += 1
        try:
            decode_graph(encode_graph(gm, example_inputs))
        except (UnsupportedGraph, ValueError) as e:
            problems.append(str(e))
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=backend, dynamic=dynamic)(*args)
    finally:
        torch._dynamo.reset()
    assert graphs > 0
    return problems


def test_tensor_type_with_a_dtype() -> None:
    # DeepSeek-V3 and XLNet: `x.type(dtype)`.
    assert _round_trip(lambda x: x.type(torch.float64) * 2, torch.randn(3, 4)) == []


def test_numpy_functions_as_dynamo_wraps_them() -> None:
    # Reformer: `np.lcm(...)` and `np.sqrt(...)`, as "<Wrapped function <original lcm>>".
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * np.lcm(x.shape[0], 3) / np.sqrt(x.shape[1])

    assert _round_trip(f, torch.randn(4, 6), dynamic=True) == []


def _qkv(x: torch.Tensor) -> torch.Tensor:
    q, k, v = x.split(2, dim=1)
    return q * k + v


def test_a_python_tensor_method_under_a_device_mode() -> None:
    # Under a torch-function mode Dynamo records `torch._tensor.Tensor.split` as a call.
    with torch.device("cpu"):
        assert _round_trip(_qkv, torch.randn(3, 6)) == []


def test_a_python_tensor_method_under_set_default_device() -> None:
    torch.set_default_device("cpu")
    try:
        assert _round_trip(_qkv, torch.randn(3, 6)) == []
    finally:
        # None, not the previous `get_default_device()`: setting "cpu" back leaves a
        # DeviceContext mode on the stack for every later test in the process.
        torch.set_default_device(None)


def test_math_on_a_dynamic_size_type_checks_on_the_worker() -> None:
    # Was accepted by the SDK and refused by the worker: "SymIntArrayRef expected to
    # contain only concrete integers" (F.pad by a symbolic amount, faked without the
    # Python dispatcher Dynamo fakes it with).
    def f(x: torch.Tensor) -> torch.Tensor:
        n = math.lcm(x.shape[0], 4)
        return torch.nn.functional.pad(x, (0, 0, 0, n - x.shape[0])) * 2

    assert _round_trip(f, torch.randn(6, 5), dynamic=True) == []


def test_global_rng_state_stays_refused_and_says_why() -> None:
    problems = _round_trip(lambda x: x * (torch.seed() % 7), torch.randn(3))
    assert problems and "random number generator" in problems[0]
