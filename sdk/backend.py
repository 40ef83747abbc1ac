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
from sdk.client import FarmClient, parse_address
from sdk.codec import UnsupportedGraph, encode_graph
from sdk.errors import ArtifactRejected, ConfigError, FarmError, FarmUnavailable, GraphRejected, JobLost
from sdk.metrics import FALLBACKS
from sdk.settings import SDKSettings
from sdk.target import Fingerprint, device_kind, local_fingerprint, local_target
from sdk.trust import Trust
from torchfarm import keys
from torchfarm.targets import Target
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
        target: Target | None = None,
    ):
        self.settings = settings
        self.mode = mode or ""
        self.target = target
        """The target asked for; None is this process's own (sdk/target.py)."""
        # The same wrapper torch.compile builds: it turns mode and options into the
        # Inductor config patch, and it is the local fallback compiler.
        self.local = torch._TorchCompileInductorWrapper(mode, options, dynamic)
        self.name = name
        self._client: FarmClient | None = FarmClient(settings.remote, settings) if settings.remote else None
        self.trust = Trust.from_settings(settings, parse_address(settings.remote)) if settings.remote else None
        self._graphs = 0
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        with self._lock:
            self._graphs += 1
            index = self._graphs
        if self.target is not None and self.target != local_target(device_kind(example_inputs)):
            return self._prewarm(gm, example_inputs, index)
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
        FALLBACKS.labels(error=type(e).__name__).inc()
        # An unreachable or untrusted farm says so once, not once per graph.
        once = ""
        if isinstance(e, FarmUnavailable):
            once = "unavailable"
        elif e.code == "untrusted_farm":
            once = "untrusted_farm"
        if once:
            if once in self._warned:
                return
            self._warned.add(once)
        code = f" [{e.code}]" if e.code else ""
        log.warning(
            "torchfarm: graph %d of %s compiles locally (%s%s): %s",
            index, self.name, type(e).__name__, code, e,
        )

    def _remote(self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> Callable:
        assert self._client is not None and self.trust is not None
        if not self.trust.loads_anything:
            raise ArtifactRejected(
                f"the farm at {self._client.address} is not on this machine and no signing "
                "keys are pinned, so none of its artifacts could be loaded; set "
                "TORCHFARM_TRUSTED_KEYS_FILE to the farm's public keys",
                "untrusted_farm",
            )
        t0 = time.perf_counter()
        try:
            graph = encode_graph(gm, example_inputs)
        except UnsupportedGraph as e:
            raise GraphRejected(f"graph cannot be sent to the farm: {e}") from e
        fp = local_fingerprint(device_kind(example_inputs))
        label = f"{self.name} graph {index} from {socket.gethostname()}"
        request = build_request(graph, fp, self.mode, self.local.config, label)
        expected_key = keys.compute_key(request, self.trust.namespace)
        t1 = time.perf_counter()
        reply, status = self._submit_and_wait(request)
        if reply.key != expected_key:
            raise ArtifactRejected(
                f"the farm answered for key {reply.key[:12]}, not this graph's {expected_key[:12]}",
                "mismatch",
            )
        t3 = time.perf_counter()
        manifest_bytes, blobs = self._client.fetch(reply.key)
        t4 = time.perf_counter()
        manifest = artifact.verify(manifest_bytes, blobs, reply.key, fp, self.trust)
        compiled = artifact.load(manifest, blobs)
        t5 = time.perf_counter()
        outcome = "hit" if reply.cache_hit else ("joined" if reply.deduplicated else "miss")
        remote = ""
        if status is not None:
            remote = " (farm: " + ", ".join(f"{t.stage} {t.seconds:.2f}s" for t in status.timings) + ")"
        log.info(
            "torchfarm: graph %d of %s: %s key=%s | encode %.2fs submit+wait %.2fs%s "
            "fetch %.2fs load %.2fs | artifact %.1f KB, %d kernels",
            index, self.name, outcome, reply.key[:12], t1 - t0, t3 - t1, remote,
            t4 - t3, t5 - t4, manifest.total_bytes() / 1024, len(manifest.kernels),
        )
        return compiled

    def _submit_and_wait(self, request) -> tuple[Any, Any]:
        """Submits, then waits unless it was a hit. A job the farm lost (Redis restarted
        under it) is submitted again: the key is the same, so this is idempotent."""
        assert self._client is not None
        for attempt in range(self.settings.max_resubmits + 1):
            reply = self._client.submit(request)
            if reply.cache_hit:
                return reply, None
            try:
                return reply, self._client.wait(reply.key)
            except JobLost:
                if attempt == self.settings.max_resubmits:
                    raise
                log.info("torchfarm: the farm lost job %s; submitting again", reply.key[:12])
        raise AssertionError("unreachable")

    def _prewarm(self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> Callable:
        """Compiles the graph on the farm for `self.target`, which this process is not,
        and runs it eagerly here (sdk/prewarm.py; docs/targets.md)."""
        from sdk import prewarm

        target = self.target
        assert target is not None
        if "prewarm" not in self._warned:
            self._warned.add("prewarm")
            log.warning(
                "torchfarm: %s compiles for %s, which this process is not (%s): the farm's "
                "cache is filled for that fleet, and this process runs the graphs eagerly",
                self.name, target, local_target(device_kind(example_inputs)),
            )
        try:
            if self._client is None:
                raise ConfigError(f"compiling for {target} needs a farm: pass remote=")
            try:
                graph = encode_graph(gm, example_inputs)
            except UnsupportedGraph as e:
                raise GraphRejected(f"graph cannot be sent to the farm: {e}") from e
            graph = prewarm.retarget_graph(graph, target)
            fleet = prewarm.fleet_fingerprints(self._client, target)
            builds = prewarm.usable_builds(fleet, torch.__version__, target)
            label = f"{self.name} graph {index} from {socket.gethostname()} (prewarm {target})"
            for fp in builds:
                request = build_request(graph, fp, self.mode, self.local.config, label)
                reply, _ = self._submit_and_wait(request)
                log.info(
                    "torchfarm: graph %d of %s for %s (torch %s): %s key=%s",
                    index, self.name, target, fp.torch_version,
                    "hit" if reply.cache_hit else "compiled", reply.key[:12],
                )
        except FarmError as e:
            if self.settings.fallback != "local" or not e.fallback:
                raise
            FALLBACKS.labels(error=type(e).__name__).inc()
            log.warning(
                "torchfarm: graph %d of %s was not compiled for %s (%s): %s",
                index, self.name, target, type(e).__name__, e,
            )
        return gm.forward
