"""Hand-built CompileRequests (and kernel manifests) for tests that must not import torch."""

from __future__ import annotations

from torchfarm.kernels import kernel_artifact
from torchfarm.v1 import farm_pb2, graph_pb2
from torchfarm.wire import builds, routing
from torchfarm.wire.manifest import Manifest


def queue_of(req: farm_pb2.CompileRequest) -> str:
    """The graph queue a request routes to: its target's, ending in its build's digest."""
    return routing.queue_for(req.target, build=builds.digest(builds.of_request(req)))


def relu_request(**changes) -> farm_pb2.CompileRequest:
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


RELU_QUEUE = queue_of(relu_request())
"""The queue a fake worker registers to take `relu_request()`."""


def kernel_manifest(key: str, binary: bytes, namespace: str = "") -> Manifest:
    """A Triton kernel's unsigned manifest naming `binary` (torchfarm/kernels/kernel_artifact.py)."""
    manifest, _ = kernel_artifact.build_manifest(
        key, namespace, target="cuda:sm_90", triton_version="3.7.0", name="k", kind="cubin",
        binary=binary, assembly="", metadata={}, worker="w", seconds=0.0,
    )
    return manifest
