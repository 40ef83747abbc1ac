"""A higher-order op has no schema, and Inductor writes some of its constants into the
kernel source it generates: flex attention's `scale` into a C++ template
(`accum_t scaling_factor = {{scale}};`), its kernel options as `NAME : tl.constexpr =
VALUE` lines of a Triton template. A graph that put text there wrote C++ and assembly
into a kernel the worker compiled: `.incbin` of any file the worker could read came back
in the signed artifact (its signing key, without a sandbox), and a constructor in the
kernel ran on the worker where it loads what it compiled (torchfarm/graph/graphcheck.py
`check_hop_constants` refuses each constant of a kind its position does not take)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.graphs import captured_graph
from torchfarm.graph.graph_errors import MalformedGraph
from torchfarm.graph.graphcheck import validate_graph
from torchfarm.v1 import graph_pb2

FLEX = "torch.ops.higher_order.flex_attention"
SCALE, KERNEL_OPTIONS = 5, 6

INJECTED = '0.25;\nasm(".pushsection .rodata\\n.incbin \\"/etc/hostname\\"\\n.popsection\\n")'


@pytest.fixture(scope="module")
def flex() -> graph_pb2.Graph:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 128, 128, device="cpu")

    def attend(q):
        return flex_attention(q, q, q, block_mask=mask, scale=0.3,
                              kernel_options={"BACKEND": "TRITON", "fwd_BLOCK_M": 64})

    return captured_graph(attend, torch.randn(1, 2, 128, 16))


@pytest.fixture(scope="module")
def checkpointed() -> graph_pb2.Graph:
    import torch.utils.checkpoint as checkpoint

    lin = torch.nn.Linear(8, 8)
    return captured_graph(
        lambda x: checkpoint.checkpoint(lambda y: lin(y).relu(), x, use_reentrant=False, determinism_check="none"),
        torch.randn(4, 8, requires_grad=True),
    )


def _flex_node(graph: graph_pb2.Graph) -> graph_pb2.Node:
    return next(n for n in graph.nodes if n.target == FLEX)


def _options(node: graph_pb2.Node) -> dict[str, graph_pb2.Argument]:
    items = node.args[KERNEL_OPTIONS].immutable_dict.items
    return {items[i].str_value: items[i + 1] for i in range(0, len(items), 2)}


def test_the_graphs_dynamo_makes_pass(flex, checkpointed):
    assert _flex_node(flex).args[SCALE].float_value == pytest.approx(0.3)
    assert _options(_flex_node(flex))["BACKEND"].str_value == "TRITON"
    validate_graph(flex)
    validate_graph(checkpointed)


def test_text_as_flex_attentions_scale_is_refused(flex):
    hostile = copy.deepcopy(flex)
    _flex_node(hostile).args[SCALE].Clear()
    _flex_node(hostile).args[SCALE].str_value = INJECTED
    with pytest.raises(MalformedGraph, match="scale"):
        validate_graph(hostile)


@pytest.mark.parametrize("kind", ["list", "immutable_dict", "tuple"])
def test_a_container_as_flex_attentions_scale_is_refused(flex, kind):
    hostile = copy.deepcopy(flex)
    scale = _flex_node(hostile).args[SCALE]
    scale.Clear()
    getattr(scale, kind).items.add(int_value=1)
    if kind == "immutable_dict":
        scale.immutable_dict.items.add(int_value=2)
    with pytest.raises(MalformedGraph, match="scale"):
        validate_graph(hostile)


def test_a_kernel_option_named_by_code_is_refused(flex):
    hostile = copy.deepcopy(flex)
    items = _flex_node(hostile).args[KERNEL_OPTIONS].immutable_dict.items
    items.add(str_value="X : tl.constexpr = 1\nimport os; os.system('id')\nY")
    items.add(int_value=1)
    with pytest.raises(MalformedGraph, match="kernel option"):
        validate_graph(hostile)


@pytest.mark.parametrize("value", ["TRITON\nimport os", "CUTE"])
def test_a_flex_backend_torch_does_not_have_is_refused(flex, value):
    hostile = copy.deepcopy(flex)
    _options(_flex_node(hostile))["BACKEND"].str_value = value
    with pytest.raises(MalformedGraph, match="BACKEND"):
        validate_graph(hostile)


def test_text_as_another_kernel_options_value_is_refused(flex):
    hostile = copy.deepcopy(flex)
    block = _options(_flex_node(hostile))["fwd_BLOCK_M"]
    block.Clear()
    block.str_value = "64\nimport os"
    with pytest.raises(MalformedGraph, match="kernel option"):
        validate_graph(hostile)


def test_text_where_a_higher_order_op_takes_none_is_refused(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    hop = next(n for n in hostile.nodes if n.target.startswith("torch.ops.higher_order."))
    hop.args.add(str_value=INJECTED)
    with pytest.raises(MalformedGraph, match="text"):
        validate_graph(hostile)


def test_a_checkpoint_determinism_check_torch_does_not_have_is_refused(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    hop = next(n for n in hostile.nodes if n.target.startswith("torch.ops.higher_order."))
    option = next(kw for kw in hop.kwargs if kw.name == "determinism_check")
    option.value.str_value = "none\n#include </etc/shadow>"
    with pytest.raises(MalformedGraph, match="determinism_check"):
        validate_graph(hostile)


def test_the_fixed_sets_are_torchs():
    import typing

    import torch.nn.attention.flex_attention as flex_module
    import torch.utils.checkpoint as checkpoint

    from torchfarm.graph import hopcheck

    assert hopcheck.FLEX_BACKENDS == set(typing.get_args(flex_module._Backend))
    assert hopcheck.DETERMINISM_CHECKS == set(checkpoint._allowed_determinism_checks_to_fns)
