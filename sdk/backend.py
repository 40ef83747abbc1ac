"""The SDK's Dynamo backend: encode → submit → wait → fetch → verify → load.

Dynamo calls the backend once per captured graph (several times for a model with
graph breaks). Each graph is compiled on the farm; when the farm cannot, and the
fallback is "local", that one graph is compiled by the local Inductor exactly as
`torch.compile` would, with one warning.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from sdk import artifact
from sdk.client import FarmClient
from sdk.codec import UnsupportedGraph, encode_graph
from sdk.errors import ConfigError, FarmError, FarmUnavailable, GraphRejected
from sdk.settings import SDKSettings
from sdk.target import Fingerprint, local_fingerprint
from torchfarm.v1 import farm_pb2, graph_pb2

log = logging.getLogger(__name__)


def build_request(
    graph: graph_pb2.Graph,
    fp: Fingerprint,
    mode: str,
    inductor_config: dict[str, Any],
    label: str,
) -> farm_pb2.CompileRequest:
    try:
        options = [
            farm_pb2.Option(name=k, json_value=json.dumps(v, sort_keys=True))
            for k, v in sorted(inductor_config.items())
        ]
    except TypeError as e:
        raise ConfigError(f"compile options must be JSON values to travel to the farm: {e}") from e
    return farm_pb2.CompileRequest(
        graph=graph,
        target=farm_pb2.Target(device=fp.device, arch=fp.arch, isa=fp.isa, compiler=fp.compiler),
        build=farm_pb2.Build(
            torch_version=fp.torch_version,
            torch_git=fp.torch_git,
            triton_version=fp.triton_version,
            python=fp.python,
            platform=fp.platform,
        ),
        options=farm_pb2.CompileOptions(
            mode=mode or "", inductor=options, dynamic=len(graph.symbols) > 0
        ),
        label=label,
    )


class FarmBackend:
    """A Dynamo backend that compiles on the farm. One instance per `sdk.compile` call."""

    def __init__(
        self,
        settings: SDKSettings,
        *,
        mode: str | None = None,
        options: dict[str, Any] | None = None,
        dynamic: bool | None = None,
        name: str = "",
    ):
        self.settings = settings
        self.mode = mode or ""
        # The same wrapper torch.compile builds: it turns mode and options into the
        # Inductor config patch, and it is the local fallback compiler.
        self.local = torch._TorchCompileInductorWrapper(mode, options, dynamic)
        self.name = name
        self._client: FarmClient | None = FarmClient(settings.remote, settings) if settings.remote else None
        self._graphs = 0
        self._lock = threading.Lock()
        self._warned_unavailable = False

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        with self._lock:
            self._graphs += 1
            index = self._graphs
        if self._client is None:
            return self.local(gm, example_inputs)
        try:
            return self._remote(gm, example_inputs, index)
        except FarmError as e:
            if self.settings.fallback != "local" or not e.fallback:
                raise
            self._warn_fallback(index, e)
            return self.local(gm, example_inputs)

    def _warn_fallback(self, index: int, e: FarmError) -> None:
        if isinstance(e, FarmUnavailable):
            if self._warned_unavailable:
                return
            self._warned_unavailable = True
        log.warning("torchfarm: graph %d of %s compiles locally: %s", index, self.name, e)

    def _remote(self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> Callable:
        assert self._client is not None
        t0 = time.perf_counter()
        try:
            graph = encode_graph(gm, example_inputs)
        except UnsupportedGraph as e:
            raise GraphRejected(f"graph cannot be sent to the farm: {e}") from e
        fp = local_fingerprint()
        label = f"{self.name} graph {index} from {socket.gethostname()}"
        request = build_request(graph, fp, self.mode, self.local.config, label)
        t1 = time.perf_counter()
        reply = self._client.submit(request)
        t2 = time.perf_counter()
        status = None
        if not reply.cache_hit:
            status = self._client.wait(reply.key)
        t3 = time.perf_counter()
        manifest_bytes, blobs = self._client.fetch(reply.key)
        t4 = time.perf_counter()
        manifest = artifact.verify(manifest_bytes, blobs, reply.key, fp)
        compiled = artifact.load(manifest, blobs)
        t5 = time.perf_counter()
        outcome = "hit" if reply.cache_hit else ("joined" if reply.deduplicated else "miss")
        remote = ""
        if status is not None:
            remote = " (farm: " + ", ".join(f"{t.stage} {t.seconds:.2f}s" for t in status.timings) + ")"
        log.info(
            "torchfarm: graph %d of %s: %s key=%s | encode %.2fs submit %.2fs wait %.2fs%s "
            "fetch %.2fs load %.2fs | artifact %.1f KB, %d kernels",
            index, self.name, outcome, reply.key[:12], t1 - t0, t2 - t1, t3 - t2, remote,
            t4 - t3, t5 - t4, manifest.total_bytes() / 1024, len(manifest.kernels),
        )
        return compiled
