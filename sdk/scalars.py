"""Python float inputs of a dynamic graph: specialized before the graph leaves the client.

With `dynamic=True` (torch 2.13's `specialize_float=False`), Dynamo passes a float such
as a LayerNorm's `eps` into the graph as a 0-d tensor and reads it back with `.item()`.
Local `torch.compile` then runs AOTAutograd's `tensorify_python_scalars` pass: what it
cannot turn into tensor arithmetic it specializes, by naming the float's symbol in
`TensorifyState` and raising `TensorifyScalarRestartAnalysis`, so that Dynamo traces the
frame again with that float as a constant (guarded on its value).

The farm cannot restart the client's Dynamo from a worker, and on the worker the
`.item()` of a plain tensor input is an unbacked float that ops such as `layer_norm`
cannot guard on. So the backend does the restart here, before encoding, for every such
float but those whose every use is arithmetic with a tensor (`x * scale`): those stay
symbolic, and one farm graph serves every value. Specializing a float torch would have tensorified away gives the same numbers and
one more recompile only when that float's value changes.

Behaviour pinned against torch 2.13.0: Dynamo's placeholder for such a float has a
`FakeTensor` example value whose `item_memo` is the SymFloat, and
`OutputGraph.remove_tensorify_specialized_graphargs` removes placeholders whose
`item_memo` symbol `TensorifyState` names.
"""

from __future__ import annotations

import logging
import operator

import torch
import torch.fx

from torchfarm.fx.internals import resolve

TensorifyScalarRestartAnalysis = resolve("TensorifyScalarRestartAnalysis")
TensorifyState = resolve("TensorifyState")
FakeTensor = resolve("FakeTensor")

log = logging.getLogger(__name__)


def tensorified_floats(gm: torch.fx.GraphModule) -> list[str]:
    """Symbol names of the float inputs Dynamo passed as 0-d tensors read with `.item()`."""
    names: list[str] = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        memo = getattr(value, "item_memo", None) if isinstance(value, FakeTensor) else None
        if memo is None or not node.users or not all(u.target == "item" for u in node.users):
            continue
        if not value.dtype.is_floating_point:
            # An integer 0-d input read with `.item()` is a SymInt that sizes can use
            # (tensorify leaves it alone); specializing it would fold `torch._check`s
            # on it into constant comparisons the farm refuses.
            continue
        if all(_tensor_arithmetic(u) for u in node.users):
            continue  # stays a symbolic float: tensorify turns it into a 0-d tensor operand
        symbol = memo.node._expr  # the symbol, not its replacement
        if hasattr(symbol, "name") and not TensorifyState.should_specialize(symbol.name):
            names.append(symbol.name)
    return names


_ARITHMETIC = (operator.mul, operator.add, operator.sub, operator.truediv)
"""Python operators AOTAutograd's `tensorify_python_scalars` turns into tensor ops
(its `SUPPORTED_OPS`) when one operand is a tensor."""


def _tensor_arithmetic(item: torch.fx.Node) -> bool:
    """Whether every use of a float's `.item()` is arithmetic with a tensor result: on
    the worker such a float is an unbacked symbol that the same pass tensorifies, with
    no guard on its value, so it need not be specialized."""
    return bool(item.users) and all(
        user.op == "call_function"
        and user.target in _ARITHMETIC
        and isinstance(user.meta.get("example_value"), torch.Tensor)
        for user in item.users
    )


def specialize_float_inputs(gm: torch.fx.GraphModule) -> None:
    """Makes Dynamo trace the frame again with its tensorified float inputs as constants.

    Raises `TensorifyScalarRestartAnalysis` (Dynamo catches it and restarts) when the
    graph has such an input; returns otherwise.
    """
    names = tensorified_floats(gm)
    if not names:
        return
    for name in names:
        TensorifyState.specialize(name)
    log.debug("specializing float inputs %s before sending the graph", ", ".join(names))
    raise TensorifyScalarRestartAnalysis


_PURE_PYTHON = ("_operator", "math")
"""Modules of the calls the format takes only with a node operand (torchfarm/graph/graphcheck.py)."""


def fold_constant_operators(gm: torch.fx.GraphModule) -> None:
    """Computes here each Python `operator` or `math` call whose operands are all
    constants, as a float specialized above leaves (`-lr` once `lr` is a constant), and
    passes its value to its users. The farm's format refuses such calls: a graph
    computes only from its inputs. A value the graph returns stays a call."""
    folded = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or getattr(node.target, "__module__", None) not in _PURE_PYTHON:
            continue
        if node.all_input_nodes or any(user.op == "output" for user in node.users):
            continue
        value = node.target(*node.args, **node.kwargs)
        if not isinstance(value, (bool, int, float)):
            continue
        _replace_uses(node, value)
        gm.graph.erase_node(node)
        folded = True
    if folded:
        gm.recompile()


def _replace_uses(node: torch.fx.Node, value: bool | int | float) -> None:
    def swap(arg: torch.fx.Node) -> torch.fx.node.Argument:
        return value if arg is node else arg

    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, swap)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, swap)
