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

What is left computing from constants alone is computed here too: a Python operator
(`fold_constant_operators`), and numpy that Dynamo traced into the graph
(`fold_numpy_constants`), both of which the farm's format refuses.

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


_NUMPY_CALLS = ("numpy_to_tensor_wrapper", "numpy_operator_wrapper", "numpy_method_wrapper")
"""How Dynamo (torch._dynamo.utils) puts a traced numpy call into the graph."""


def _numpy_on_constants(node: torch.fx.Node, folded: dict[torch.fx.Node, torch.Tensor]) -> bool:
    target = node.target
    if node.op != "call_function" or type(target).__name__ not in _NUMPY_CALLS:
        return False
    if getattr(getattr(target, "f", None), "__module__", "").startswith("torch._numpy.random"):
        return False  # a draw at each call, not a constant
    return all(n in folded for n in node.all_input_nodes)


def fold_numpy_constants(gm: torch.fx.GraphModule) -> None:
    """Computes here each numpy call Dynamo traced whose operands are constants (a
    sinusoidal embedding's `-(np.log(10000.0) / (d - 1))`), and gives the graph's other
    nodes a `torch.full` of each 0-d result's value and dtype in its place. The farm
    refuses numpy calls (AOTAutograd's cache does not take a graph with them), so such a
    graph was split at them. A random draw (`np.random`, which Dynamo traces on torch's
    generator) and a result of more than one element that the graph reads stay calls."""
    folded: dict[torch.fx.Node, torch.Tensor] = {}
    for node in gm.graph.nodes:
        if _numpy_on_constants(node, folded):
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), folded.__getitem__)
            value = node.target(*args, **kwargs)
            if isinstance(value, torch.Tensor):
                folded[node] = value
    while kept := [n for n, v in folded.items() if v.dim() and any(u not in folded for u in n.users)]:
        for node in kept:
            del folded[node]
    for node, value in folded.items():
        if any(user not in folded for user in node.users):
            with gm.graph.inserting_before(node):
                constant = gm.graph.call_function(
                    torch.full, ((), value.item()), {"dtype": value.dtype, "device": value.device}
                )
            constant.meta = dict(node.meta)
            node.replace_all_uses_with(constant, delete_user_cb=lambda user: user not in folded)
    for node in reversed(folded):
        gm.graph.erase_node(node)
    if folded:
        gm.recompile()


def _replace_uses(node: torch.fx.Node, value: bool | int | float) -> None:
    def swap(arg: torch.fx.Node) -> torch.fx.node.Argument:
        return value if arg is node else arg

    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, swap)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, swap)
