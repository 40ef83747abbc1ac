"""The cache key: stable across processes, sensitive to everything that matters."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchfarm import keys
from tests.requests import relu_request as _request
from torchfarm.v1 import farm_pb2


def test_key_is_stable_in_another_process():
    here = keys.compute_key(_request())
    code = (
        "import sys; sys.path.insert(0, '.'); from tests.requests import relu_request as _request;"
        "from torchfarm import keys; print(keys.compute_key(_request()))"
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
