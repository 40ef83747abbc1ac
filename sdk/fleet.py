"""Compiling for a target this process is not: fill the farm's cache for that fleet.

`sdk.compile(model, target="cuda:sm_90")` on a laptop cannot load what the farm builds
(an sm_90 artifact is not code for this machine, and `sdk.artifact.verify` would refuse
it anyway). What it can do is compile each graph *for the fleet*, so the fleet's own
processes later find it as a cache hit. For that the request must carry exactly what a
fleet machine's request will carry, since all of it is in the key:

- the fleet's build (torch build, Triton, Python, platform, ISA, compiler): taken from
  the live workers that lower graphs for the target (their heartbeat carries it), one
  compile per distinct build; a fleet running another torch *version* than this
  process is skipped, because Dynamo's capture differs between versions;
- the graph as the fleet captures it: the same Dynamo graph with every device moved
  to the target's torch device ("cuda", index 0; ROCm builds also say "cuda").

The process itself runs each graph eagerly: there is nothing it could load. The hit
is best-effort: if a fleet machine's capture differs (other shapes, a graph break
elsewhere), its key differs and it compiles as usual; nothing wrong is ever loaded,
since the key covers everything and the fleet verifies what it loads.
"""

from __future__ import annotations

import logging
from typing import Any

from google.protobuf.message import Message

from sdk.client import CompileClient
from sdk.errors import FarmUnavailable, NoWorker
from torchfarm.fx.fingerprint import Fingerprint
from torchfarm.v1 import graph_pb2
from torchfarm.wire.codes import JobError, Reason
from torchfarm.wire.targets import Target

log = logging.getLogger(__name__)


def fleet_fingerprints(client: CompileClient, target: Target) -> list[Fingerprint]:
    """The distinct builds of the live workers that lower graphs for `target`."""
    status = client.status()
    found: dict[Fingerprint, None] = {}
    for worker in status.workers:
        for served in worker.targets:
            if served.target == str(target) and "graph" in served.jobs and worker.fingerprint:
                fields = {**dict(worker.fingerprint), "device": target.device, "arch": target.arch}
                try:
                    found[Fingerprint.from_dict(fields)] = None
                except ValueError as e:  # a worker of another SDK version
                    log.warning("worker %s: unusable build fingerprint: %s", worker.name, e)
    return list(found)


def usable_builds(fleet: list[Fingerprint], local_torch: str, target: Target) -> list[Fingerprint]:
    """The fleet builds a graph captured here can serve: same torch version (any build)."""
    if not fleet:
        raise NoWorker(f"no live worker compiles graphs for target {target}", Reason.NO_WORKER)
    mine = local_torch.split("+")[0]
    usable = [fp for fp in fleet if fp.torch_version.split("+")[0] == mine]
    if not usable:
        theirs = ", ".join(sorted({fp.torch_version for fp in fleet}))
        raise FarmUnavailable(
            f"the workers for {target} run torch {theirs}; this process runs {local_torch}, "
            "whose graphs would not match theirs", JobError.BUILD_MISMATCH,
        )
    return usable


def retarget_graph(graph: graph_pb2.Graph, target: Target) -> graph_pb2.Graph:
    """A copy of `graph` with every device on the target's torch device."""
    out = graph_pb2.Graph()
    out.CopyFrom(graph)
    device_type = target.torch_device
    index = -1 if device_type in ("cpu", "mps") else 0
    _retarget(out, device_type, index)
    return out


def _retarget(msg: Message, device_type: str, index: int) -> None:
    if isinstance(msg, graph_pb2.Device):
        if msg.type != device_type:
            msg.type, msg.index = device_type, index
        return
    for field, value in msg.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        if isinstance(value, Message):
            _retarget(value, device_type, index)
            continue
        items: Any = value.values() if hasattr(value, "values") else value  # a map, or a list
        for item in items:
            if isinstance(item, Message):
                _retarget(item, device_type, index)
