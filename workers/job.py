"""What every compile step works on and how it fails: a job's checked request
(`Prepared`, decoded once where it runs here), `JobFailed`, and the shape guards a
compile added. Below both the job runner (runtime.py) and the executors
(workers/executor.py), which share them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torchfarm.fx import global_state
from torchfarm.fx import guards as shape_guards
from torchfarm.fx.decode import DecodedGraph
from torchfarm.graph.graph_errors import GraphError
from torchfarm.v1 import farm_pb2
from torchfarm.wire.codes import JobError
from workers import fakepg


class JobFailed(Exception):
    """Ends a job as FAILED without a retry; `code`'s name is what clients see. Only a
    `JobError` member is taken: a code is part of the contract (torchfarm/wire/codes.py)."""

    def __init__(self, code: JobError, message: str):
        if not isinstance(code, JobError):
            raise TypeError(f"JobFailed takes a torchfarm.wire.codes.JobError, not {code!r}")
        super().__init__(message)
        self.code = code


@dataclass
class Prepared:
    """A job's request, checked: what every compile path starts from."""

    request: farm_pb2.CompileRequest
    decoded_graph: DecodedGraph | None
    """The decoded graph once a path in this process asked for it (`decoded`); None
    where the job compiles in the sandbox, whose child decodes it: tenant bytes are
    fake-propagated only there, under its memory and CPU limits."""
    inductor_options: dict[str, Any]
    decode_s: float
    began: float
    """`time.perf_counter()` when this job began."""

    @property
    def decoded(self) -> DecodedGraph:
        """The graph decoded in this process, under the grad mode and autocast it was
        captured in: only for a compile that runs here (no sandbox, a GPU faked)."""
        if self.decoded_graph is None:
            try:
                with global_state.applied(self.request.options):
                    self.decoded_graph = fakepg.decoded(self.request.graph)
            except GraphError as e:
                raise JobFailed(JobError.INVALID_GRAPH, str(e)) from e
        return self.decoded_graph

    def redecoded(self) -> Prepared:
        """The same, to be decoded afresh: a compile that gave up leaves guards in its ShapeEnv."""
        return dataclasses.replace(self, decoded_graph=None)


def added_guards(decoded: DecodedGraph, mark: tuple) -> tuple[list, ...]:
    """The shape guards the compile added, over the client's symbol names: in a local
    torch.compile they would be Dynamo's guards, so they travel with the artifact."""
    names = {expr: name for name, expr in decoded.symbols.items() if expr.is_Symbol}
    try:
        return tuple(
            shape_guards.encode(e, names)
            for e in shape_guards.added_since(decoded.shape_env, mark)
        )
    except shape_guards.GuardError as e:
        raise JobFailed(
            JobError.UNSHIPPABLE_GUARD, f"the compile added a shape guard the farm cannot ship: {e}"
        ) from e
