"""Errors raised while validating or decoding a serialized graph (`graph_pb2.Graph`).

The tree::

    GraphError (ValueError)      the graph cannot be compiled by the farm
    ├── DisallowedOp             a target is not on the farm's allow-list (`.target` names it)
    ├── MalformedGraph           the message is inconsistent (dangling reference, bad dtype)
    └── GraphTooLarge            the graph exceeds a `GraphLimits` bound

Every `GraphError` is about the graph itself, so retrying the same graph cannot succeed.
The SDK answers all of them the same way: it compiles locally instead. The coordinator
maps them to INVALID_ARGUMENT. This module imports neither torch nor grpc.
"""

from __future__ import annotations

from torchfarm.graph import allowlist


class GraphError(ValueError):
    """Base class: the graph was rejected. Never transient."""


class DisallowedOp(GraphError):
    """A call_function or call_method target that the farm will not run."""

    def __init__(self, target: str, kind: str = "op") -> None:
        self.target = target
        super().__init__(allowlist.refusal(target, kind))


class MalformedGraph(GraphError):
    """The graph does not follow the format's rules (see `torchfarm.graph.graphcheck`)."""


class GraphTooLarge(GraphError):
    """The graph exceeds one of the bounds in `torchfarm.graph.graphcheck.GraphLimits`."""
