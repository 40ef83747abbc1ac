"""The cache key: stable across processes, sensitive to everything that matters."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchfarm import keys
from torchfarm.v1 import farm_pb2, graph_pb2


def _request(**changes) -> farm_pb2.CompileRequest:
    graph = graph_pb2.Graph(
        format=graph_pb2.GRAPH_FORMAT_V1,
        nodes=[
            graph_pb2.Node(
                name="x",
                op=graph_pb2.Node.PLACEHOLDER,
                target="x",
                tensor=graph_pb2.TensorMeta(
                    shape=[graph_pb2.SymExpr(expr="4", hint=4)],
                    stride=[graph_pb2.SymExpr(expr="1", hint=1)],
                    dtype=changes.pop("dtype", "float32"),
                    device=graph_pb2.Device(type="cpu", index=-1),
                    kind=graph_pb2.TensorMeta.INPUT,
                ),
            ),
            graph_pb2.Node(
                name="y", op=graph_pb2.Node.CALL_FUNCTION, target="torch.relu",
                args=[graph_pb2.Argument(node="x")],
            ),
            graph_pb2.Node(
                name="output", op=graph_pb2.Node.OUTPUT, target="output",
                args=[graph_pb2.Argument(tuple=graph_pb2.ArgumentList(items=[graph_pb2.Argument(node="y")]))],
            ),
        ],
    )
    req = farm_pb2.CompileRequest(
        graph=graph,
        target=farm_pb2.Target(device="cpu", isa=changes.pop("isa", "avx512"), compiler="g++ 12.2.0"),
        build=farm_pb2.Build(
            torch_version=changes.pop("torch_version", "2.13.0+cpu"), torch_git="abc",
            triton_version=changes.pop("triton_version", "3.7.0"), python="3.11",
            platform="linux-x86_64",
        ),
        options=farm_pb2.CompileOptions(
            mode=changes.pop("mode", ""),
            inductor=[farm_pb2.Option(name=k, json_value=v) for k, v in changes.pop("options", {}).items()],
        ),
        label=changes.pop("label", "model graph 1"),
    )
    assert not changes
    return req


def test_key_is_stable_in_another_process():
    here = keys.compute_key(_request())
    code = (
        "import sys; sys.path.insert(0, '.'); from tests.unit.test_keys import _request;"
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
