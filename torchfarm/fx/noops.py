"""Calls in a Dynamo graph that do not change what the graph computes, dropped before
encoding, as AOTAutograd's trace drops them for Inductor.

AOTAutograd traces a Dynamo graph at the dispatcher: a Python call that dispatches no
tensor op, such as `torch._C._log_api_usage_once` (API-usage logging, which
`transformers` 5.x decoders call inside their graph), runs once while tracing and is
not in the graph Inductor compiles. Profiler ranges mark time in a trace; the compiled
code has none. Sending such a call would make the farm refuse a graph for a call whose
result nothing uses, so the SDK leaves it out; the key covers what is sent.

Runtime checks (`torch._check*`, `_assert_scalar`) change the compiled code's guards
and asserts, so they are kept and are on the allow-list.
"""

from __future__ import annotations

import torch
import torch.fx

from torchfarm.fx.internals import resolve

NO_OP_TARGETS = frozenset(
    {
        "torch._C._log_api_usage_once",
        "torch._C._log_api_usage_metadata",
    }
)
"""Call targets, by qualified name, that are dropped when nothing uses their result."""

PROFILER_ENTER = frozenset(
    {
        "torch.ops.profiler._record_function_enter.default",
        "torch.ops.profiler._record_function_enter_new.default",
    }
)
"""Opening of a profiler range; its handle is read only by the matching exit."""

PROFILER_EXIT = frozenset(
    {
        "torch.ops.profiler._record_function_exit.default",
        "torch.ops.profiler._record_function_exit._RecordFunction",
    }
)


PYBIND11_RECORD = "pybind11_detail_function_record_"
"""How pybind11 3 starts a bound function's `__qualname__`: its own record type, then
the name ("pybind11_detail_function_record_v1_..._log_api_usage_once")."""


def own_qualname(target: object) -> str | None:
    """`target.__qualname__`, less the record type pybind11 3 puts before a bound
    function's name (torch 2.11's CUDA build binds `torch._C._log_api_usage_once` so)."""
    qualname = getattr(target, "__qualname__", None)
    if isinstance(qualname, str) and qualname.startswith(PYBIND11_RECORD):
        return qualname.rpartition(".")[2]
    return qualname


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, (resolve("OpOverload"), resolve("OpOverloadPacket"))):
        return f"torch.ops.{target}"
    return f"{getattr(target, '__module__', None)}.{own_qualname(target)}"


def droppable_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The call_function nodes `encode_graph` leaves out of the graph it sends."""
    dropped: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = _target_name(node)
        if name in NO_OP_TARGETS and not node.users:
            dropped.add(node)
        elif name in PROFILER_ENTER and all(
            _target_name(u) in PROFILER_EXIT and not u.users for u in node.users
        ):
            dropped.add(node)
            dropped.update(node.users)
    return dropped
