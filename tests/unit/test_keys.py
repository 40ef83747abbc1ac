"""The cache key: stable across processes, sensitive to everything that matters."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.requests import relu_request as _request
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys


def test_key_is_stable_in_another_process():
    here = keys.compute_key(_request())
    code = (
        "import sys; sys.path.insert(0, '.'); from tests.requests import relu_request as _request;"
        "from torchfarm.wire import keys; print(keys.compute_key(_request()))"
    )
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert there.stdout.strip() == here
    assert len(here) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"dtype": "float16"},
        {"isa": "avx2"},
        {"torch_version": "2.13.1+cpu"},
        {"triton_version": "3.7.1"},
        {"mode": "max-autotune"},
        {"options": {"epilogue_fusion": "false"}},
    ],
    ids=lambda c: next(iter(c)),
)
def test_key_changes_with(change):
    assert keys.compute_key(_request(**change)) != keys.compute_key(_request())


def test_shape_changes_key():
    a = _request()
    b = _request()
    b.graph.nodes[0].tensor.shape[0].expr = "8"
    b.graph.nodes[0].tensor.shape[0].hint = 8
    assert keys.compute_key(a) != keys.compute_key(b)


def test_label_is_not_in_key():
    assert keys.compute_key(_request(label="a")) == keys.compute_key(_request(label="b"))


def test_option_order_does_not_matter():
    a = _request(options={"a": "1", "b": "2"})
    b = _request()
    b.options.inductor.extend([farm_pb2.Option(name="b", json_value="2"), farm_pb2.Option(name="a", json_value="1")])
    assert keys.compute_key(a) == keys.compute_key(b)


def _dynamic_request(hint: int, **changes) -> farm_pb2.CompileRequest:
    """relu over a (s0,) input, captured when s0 was `hint`."""
    req = _request(**changes)
    req.graph.symbols.add(name="s0", hint=hint, min=2, max=0)
    size = req.graph.nodes[0].tensor.shape[0]
    size.expr, size.hint = "s0", hint
    req.options.dynamic = True
    return req


def test_hints_are_not_in_key():
    assert keys.compute_key(_dynamic_request(4)) == keys.compute_key(_dynamic_request(8))


def test_symbolic_shape_is_in_key():
    other = _dynamic_request(4)
    other.graph.nodes[0].tensor.shape[0].expr = "2*s0"
    assert keys.compute_key(other) != keys.compute_key(_dynamic_request(4))


def test_symbol_range_is_in_key():
    other = _dynamic_request(4)
    other.graph.symbols[0].min = 0
    assert keys.compute_key(other) != keys.compute_key(_dynamic_request(4))


def test_specialize_hints_splits_exactly_on_hints():
    a, b = _dynamic_request(4), _dynamic_request(8)
    a.specialize_hints = b.specialize_hints = True
    assert keys.compute_key(a) != keys.compute_key(b)
    assert keys.compute_key(a) != keys.compute_key(_dynamic_request(4))


def test_hints_nested_in_arguments_are_not_in_key():
    a, b = _dynamic_request(4), _dynamic_request(8)
    for req, hint in ((a, 4), (b, 8)):
        arg = req.graph.nodes[1].args.add()
        item = arg.tuple.items.add()
        item.sym.expr, item.sym.hint = "s0", hint
    assert keys.compute_key(a) == keys.compute_key(b)
    assert a.graph.nodes[1].args[1].tuple.items[0].sym.hint == 4  # the request is not changed


def test_key_version_is_current():
    assert keys.KEY_VERSION == "torchfarm.key/3"


def test_global_state_enters_the_key_only_when_set():
    plain = _request()
    assert set(keys.options_canonical(plain.options)) == {"mode", "dynamic", "inductor"}
    no_grad = _request()
    no_grad.options.no_grad = True
    autocast = _request()
    autocast.options.autocast.add(device_type="cpu", dtype="bfloat16")
    math = _request()
    math.options.sdpa_backends.append("MATH")
    flash_first = _request()
    flash_first.options.sdpa_backends.extend(["FLASH_ATTENTION", "MATH"])
    math_first = _request()
    math_first.options.sdpa_backends.extend(["MATH", "FLASH_ATTENTION"])  # the priority counts
    deterministic = _request()
    deterministic.options.deterministic = True
    warn_only = _request()
    warn_only.options.deterministic, warn_only.options.deterministic_warn_only = True, True
    requests = (plain, no_grad, autocast, math, flash_first, math_first, deterministic, warn_only)
    assert len({keys.compute_key(r) for r in requests}) == len(requests)
