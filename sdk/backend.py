"""The SDK's Dynamo backend: encode → submit → wait → fetch → verify → load.

Dynamo calls the backend once per captured graph (several times for a model with
graph breaks). Each graph is compiled on the farm; when the farm cannot, and the
fallback is "local", that one graph is compiled by the local Inductor exactly as
`torch.compile` would. Where each graph was compiled is always said: one INFO line per
graph (the farm's outcome and key, or a local compile, its time and why), a warning at
the first fallback of each kind, a tally at exit and a record in TORCH_TRACE
(sdk/outcomes.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from sdk import artifact, changed_settings, lifting, outcomes, report, split, warm_mode
from sdk.client import CompileClient, shared_client
from sdk.errors import (
    ArtifactRejected,
    ConfigError,
    FarmError,
    FarmUnavailable,
    GraphRejected,
    RemoteCompileError,
)
from sdk.metrics import FALLBACKS, SPLITS, rejected
from sdk.nonblocking import Swapper
from sdk.progress import Progress
from sdk.scalars import fold_constant_operators, fold_numpy_constants, specialize_float_inputs
from sdk.settings import SDKSettings
from sdk.settings import load as load_settings
from sdk.trust import Trust, untrusted_message
from torchfarm.fx import global_state, regions
from torchfarm.fx.encode import UnsupportedGraph, encode_graph
from torchfarm.fx.fingerprint import Fingerprint, device_kind, local_fingerprint, local_target
from torchfarm.fx.guards import CallGuard, CaptureShapes, GuardError
from torchfarm.fx.internals import resolve
from torchfarm.graph.customops import refused_op
from torchfarm.tables import stage_timings
from torchfarm.v1 import farm_pb2, graph_pb2
from torchfarm.wire import keys
from torchfarm.wire import options as farm_options
from torchfarm.wire.codes import JobError, Rejection
from torchfarm.wire.labels import clip_label
from torchfarm.wire.targets import Target

log = logging.getLogger(__name__)

FARM_LINE = (
    "torchfarm: graph %d of %s: %s%s key=%s | encode %.2fs submit+wait %.2fs%s "
    "fetch %.2fs load %.2fs | artifact %.1f KB, %d kernels"
)
"""The INFO line of a graph from the farm: its outcome and where its seconds went
(bench/gpu_bench.py reads the phases)."""


def build_request(
    graph: graph_pb2.Graph,
    fp: Fingerprint,
    mode: str,
    inductor_config: dict[str, Any],
    label: str,
) -> farm_pb2.CompileRequest:
    if not {"cpp.threads", "cpp.dynamic_threads"} & inductor_config.keys():
        inductor_config = {**inductor_config, **_thread_options(fp)}
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
            # "default" is no mode in torch.compile: one compile, so one key.
            mode="" if mode in (None, "default") else mode,
            inductor=options,
            dynamic=len(graph.symbols) > 0,
        ),
        label=clip_label(label),
    )


def _thread_options(fp: Fingerprint) -> dict[str, Any]:
    """Inductor sizes each parallel C++ kernel's per-thread buffers for the thread count
    it compiles under, and runs a team of the caller's count when that count is the
    machine's: a worker with fewer threads than its client would ship kernels that write
    past their buffers. A CPU graph is compiled for this process's count, as a local
    compile would be (within the farm's bound); the few C++ kernels of a GPU graph size
    their buffers at run time, so GPU artifacts stay shared across hosts."""
    if fp.device == "cpu":
        return {"cpp.threads": int(min(torch.get_num_threads(), farm_options.RANGES["cpp.threads"][1]))}
    return {"cpp.dynamic_threads": True}


@dataclass(frozen=True)
class _Prepared:
    """A graph ready to send: what `_remote` builds on the calling thread."""

    index: int
    request: farm_pb2.CompileRequest
    key: str
    fingerprint: Fingerprint
    encode_s: float
    shapes: CaptureShapes
    """The graph's symbols in Dynamo's ShapeEnv: where shipped shape guards go."""
    compile_id: Any = None
    """Dynamo's compile that captured the graph: where its TORCH_TRACE record goes."""


@dataclass(frozen=True)
class _Given:
    """What an `sdk.compile` call gave its backend, and all a pickle of it carries."""

    remote: str
    fallback: str
    mode: str | None
    options: dict[str, Any] | None
    dynamic: bool | None
    name: str
    target: Target | None
    wait: bool


def _checked_call(
    compiled: Callable[..., Any], eager: Callable[..., Any], guard: CallGuard
) -> Callable[..., Any]:
    """`compiled` at the sizes its shape guards admit, `eager` at any other."""

    def call(*args: Any) -> Any:
        return compiled(*args) if guard.admits(args) else eager(*args)

    return call


def _made_again(given: _Given) -> FarmBackend:
    """A pickled backend, made again with this process's settings. One that swapped
    compiled graphs in (wait=False) waits for each compile instead: the swaps happen at a
    hook on the compiled module (sdk/nonblocking.py), which its pickle does not carry."""
    settings = dataclasses.replace(load_settings(), remote=given.remote, fallback=given.fallback)
    if not given.wait:
        log.info("torchfarm: %s was compiled with wait=False; loaded from a pickle, it waits "
                 "for each graph's compile (mostly hits of its earlier ones)", given.name)
    return FarmBackend(
        settings, mode=given.mode, options=given.options, dynamic=given.dynamic, name=given.name,
        target=given.target,
    )


class FarmBackend:
    """A Dynamo backend that compiles on the farm. One instance per `sdk.compile` call.

    With `wait=False` a graph runs eagerly until its compile is ready (sdk/nonblocking.py)."""

    def __init__(
        self,
        settings: SDKSettings,
        *,
        mode: str | None = None,
        options: dict[str, Any] | None = None,
        dynamic: bool | None = None,
        name: str = "",
        target: Target | None = None,
        wait: bool = True,
        client: CompileClient | None = None,
    ):
        self.settings = settings
        self._given = _Given(settings.remote, settings.fallback, mode, options, dynamic, name, target, wait)
        # The same wrapper torch.compile builds: it turns mode and options into the
        # Inductor config patch, and it is the local fallback compiler.
        self.local = resolve("TorchCompileInductorWrapper")(mode, options, dynamic)
        self._own_client = client is None
        if client is None and settings.remote:
            client = shared_client(settings)
        self.client = client
        """The farm's client: `client` if given (an in-process one, say), else the
        process's gRPC `FarmClient` for `settings.remote`; None: no farm, every graph
        compiles here."""
        self.trust = Trust.from_settings(settings, client.address) if client is not None else None
        self._graphs = 0
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._down: str | None = None
        """Whether an untrusted farm answered: "" it did, else why not; None: not asked."""
        self.reports = report.active_sinks()
        """Where each graph's outcome goes: `sdk.warm`'s and `torchfarm warm`'s reports."""
        self.progress = Progress(name, settings, lambda: self._graphs)
        self.swapper: Swapper | None = None if wait else Swapper(name, settings.fallback)
        """Set with wait=False: the graphs handed out, and their switch to compiled code."""
        self._pieces: dict[int, int] = {}
        """A split graph's piece's index → the graph's index."""
        self.farm_keys: dict[int, tuple[Callable[..., Any], str]] = {}
        """id of each callable this backend returned for a farm artifact → (it, its key):
        what a precompiled package names for each of its frames' backends."""
        self._say_where()

    @property
    def mode(self) -> str:
        return self._given.mode or ""

    @property
    def target(self) -> Target | None:
        """The target asked for; None is this process's own (torchfarm/fx/fingerprint.py)."""
        return self._given.target

    @property
    def name(self) -> str:
        return self._given.name

    def __eq__(self, other: object) -> bool:
        """Backends of equal calls are equal, as torch.compile's are: Dynamo shares a
        code's graphs only between equal backends, so blocks compiled one by one (each
        transformer block, as torchtitan and FSDP2 code does) were each a recompile of
        the same code, and past the recompile limit ran eagerly. A backend that swaps
        graphs in (wait=False) is equal only to itself: its swapper is its model's."""
        if not isinstance(other, FarmBackend) or not (self._given.wait and other._given.wait):
            return self is other
        same_client = (self._own_client and other._own_client) or self.client is other.client
        # A backend made while `sdk.warm` collects reports its graphs there: another warm's
        # graphs must come to its own backend, not to this one's Dynamo cache entries.
        return (same_client and report.same_sinks(self.reports, other.reports) and self._compile() == other._compile()
                and self.settings == other.settings)

    def __hash__(self) -> int:
        return hash((self._given.remote, self._given.mode, self._given.wait))

    def _compile(self) -> _Given:
        """What the call gave that changes a compile: the model's name only labels it."""
        return dataclasses.replace(self._given, name="")

    def __deepcopy__(self, memo: dict[int, Any]) -> FarmBackend:
        """A copy of a compiled module (an EMA model) compiles through this backend: one
        client, one channel and one count of graphs in a process."""
        return self

    def __reduce__(self) -> tuple[Callable[..., FarmBackend], tuple[_Given]]:
        """A pickled compiled module (`torch.save(model)`) carries what the call gave,
        never the settings' token or keys: where it loads, the backend is made again
        from that process's settings (TORCHFARM_*)."""
        return (_made_again, (self._given,))

    def _say_where(self) -> None:
        """Warns, once a process, of a model that no farm compiles because none is
        configured, and of a farm whose artifacts load unverified. (A farm that cannot be
        trusted is warned of at the first graph, once it answered: a farm that is down is
        reported as down first.)"""
        if self.client is None:
            _warn_once(
                "no farm", "torchfarm: no farm configured (remote= or TORCHFARM_REMOTE): %s and any "
                "other model compile locally, as torch.compile would", self.name,
            )
        elif self.trust is not None and self.trust.unsigned:
            address = self.client.address
            _warn_once(
                f"unsigned {address}", "torchfarm: artifacts from the farm at %s load without a "
                "signature check (TORCHFARM_TRUST_UNSIGNED names it); for a farm that signs, pin its "
                "keys instead (TORCHFARM_TRUSTED_KEYS_FILE)", address,
            )

    def farm_key(self, fn: Any) -> str | None:
        """The farm key of a graph this backend returned; None for one compiled here."""
        found = self.farm_keys.get(id(fn))
        return found[1] if found is not None and found[0] is fn else None

    def _keyed(self, fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        with self._lock:
            self.farm_keys[id(fn)] = (fn, key)
        return fn

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if self.client is not None or self.target is not None:
            specialize_float_inputs(gm)  # may restart Dynamo's trace (sdk/scalars.py)
            fold_constant_operators(gm)  # what the specialized floats left: `-lr` of a constant
            fold_numpy_constants(gm)  # numpy on constants: `np.log(10000.0) / (d - 1)`
        regions.inline_for_training(gm, example_inputs)  # torch 2.13's backward of a reused region is wrong
        with self._lock:
            self._graphs += 1
            index = self._graphs
        if self.target is not None and self.target != local_target(device_kind(example_inputs)):
            return self._lifted(self._prewarm, gm, example_inputs, index)
        if self.client is None:
            return self._local(gm, example_inputs, index, "no farm configured")
        return self._lifted(self._farm_or_local, gm, example_inputs, index)

    def _lifted(
        self, via: Callable[[torch.fx.GraphModule, list[Any], int], Callable[..., Any]],
        gm: torch.fx.GraphModule, example_inputs: list[Any], index: int,
    ) -> Callable[..., Any]:
        """The graph through `via` as the farm takes it: the tensors it reads by get_attr
        (an optimizer's parameters and state) made inputs, passed by reference at each
        call (sdk/lifting.py). A split's pieces read none, so lifting is done once, here."""
        lifted = lifting.lift_attribute_tensors(gm, example_inputs)
        if lifted is None:
            return via(gm, example_inputs, index)
        return lifted.bind(via(lifted.gm, lifted.example_inputs, index))

    def _farm_or_local(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int
    ) -> Callable[..., Any]:
        """The graph from the farm, or with fallback "local", compiled here when the farm cannot."""
        if self.swapper is not None:
            return self._remote_nonblocking(gm, example_inputs, index)
        try:
            return self._remote(gm, example_inputs, index)
        except FarmError as e:
            if self.settings.fallback != "local" or not e.fallback:
                raise
            pieces = self._split(gm, example_inputs, index, e)
            if pieces is not None:
                return pieces
            if warm_mode.active():  # `torchfarm warm` fills the farm's cache: a local compile fills nothing
                self._warn_fallback(index, e, "runs eagerly under torchfarm warm")
                self._publish(index, report.FAILED, error=f"{type(e).__name__}: {e}")
                return gm.forward
            self._warn_fallback(index, e)
            self._publish(index, report.LOCAL, error=f"{type(e).__name__}: {e}")
            return self._local(gm, example_inputs, index, _reason(e))

    def _split(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int, error: FarmError
    ) -> Callable[..., Any] | None:
        """The graph as pieces around the calls the farm refuses, each piece from the farm
        (sdk/split.py), when `error` is a refusal of calls: the format's, or the farm's
        of a custom op it named. None when it refuses no call (the graph as a whole, say)
        or the graph cannot be split.

        Asked only once the graph was refused, so a graph the farm takes pays nothing;
        only with fallback "local": "error" raises the refusal."""
        if not (self.settings.split_refused and self.settings.fallback == "local"):
            return None
        ops: dict[str, str] | None = None  # the format's refusals, found again by split
        if not isinstance(error.__cause__, UnsupportedGraph):
            named = refused_op(str(error)) if isinstance(error, RemoteCompileError) else None
            if named is None:
                return None
            ops = dict([named])
        try:
            found = split.split_refused(gm, example_inputs, ops)
        except split.NotSplit as e:
            log.info("torchfarm: graph %d of %s cannot be split at its refused calls: %s", index, self.name, e)
            return None
        except Exception:  # noqa: BLE001 - a failed split costs only the split: the graph compiles whole
            log.warning("torchfarm: graph %d of %s: splitting it at its refused calls failed; it "
                        "compiles whole", index, self.name, exc_info=True)
            return None
        if found is None:
            return None
        first, why = next(iter(found.refused.items()))
        with self._lock:
            indices = list(range(self._graphs + 1, self._graphs + 1 + len(found.pieces)))
            self._graphs += len(indices)
            self._pieces.update(dict.fromkeys(indices, index))
        self._publish(index, report.SPLIT, error=(
            f"ran eagerly: {', '.join(found.refused)} ({'; '.join(dict.fromkeys(found.refused.values()))})"
        ))
        log.info(
            "torchfarm: graph %d of %s: %d call(s) the farm refuses run eagerly (%s: %s); "
            "the rest is graph(s) %s", index, self.name, len(found.refused), first, why,
            ", ".join(map(str, indices)) or "none",
        )
        if "split" not in self._warned:
            self._warned.add("split")
            log.warning(
                "torchfarm: %s: graph %d is split at calls the farm refuses, which run eagerly "
                "(%s: %s); TORCHFARM_SPLIT_REFUSED=0 compiles such graphs whole, locally",
                self.name, index, first, why,
            )
        outcomes.record(report.SPLIT)
        SPLITS.labels(refused_by="format" if ops is None else "farm").inc()
        outcomes.trace({"model": self.name, "graph": index, "where": "split", "eager": found.refused,
                        "pieces": indices})
        for piece, piece_index in zip(found.pieces, indices, strict=True):
            found.install(piece, self._farm_or_local(piece.gm, piece.example_inputs, piece_index))
        return found.root

    def _local(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int, why: str
    ) -> Callable[..., Any]:
        """Compiles the graph with the local Inductor, as torch.compile would, and says so."""
        t0 = time.perf_counter()
        compiled = cast("Callable[..., Any]", self.local(gm, example_inputs))
        seconds = time.perf_counter() - t0
        log.info("torchfarm: graph %d of %s: compiled locally in %.2fs (%s)", index, self.name, seconds, why)
        outcomes.record(report.LOCAL)
        outcomes.trace({"model": self.name, "graph": index, "where": "local", "seconds": seconds, "why": why})
        return compiled

    def _publish(self, index: int, outcome: str, **fields: Any) -> None:
        if index in self._pieces:
            fields["split_from"] = self._pieces[index]
        if self.reports:
            report.publish(self.reports, report.GraphReport(self.name, index, outcome, **fields))

    def _warn_fallback(self, index: int, e: FarmError, instead: str = "compiles locally") -> None:
        FALLBACKS.labels(error=type(e).__name__).inc()
        # An unreachable or untrusted farm is warned of once, not once per graph (each
        # graph's own INFO line gives its reason); a farm bug (FarmBug) is not an outage
        # and is warned of every time, with its key.
        once = ""
        if isinstance(e, FarmUnavailable):
            once = "unavailable"
        elif e.code == Rejection.UNTRUSTED_FARM:
            once = Rejection.UNTRUSTED_FARM
        if once:
            if once in self._warned:
                return
            self._warned.add(once)
        code = f" [{e.code}]" if e.code else ""
        log.warning(
            "torchfarm: graph %d of %s %s (%s%s): %s",
            index, self.name, instead, type(e).__name__, code, _warned_text(str(e)),
        )
        log.debug("torchfarm: graph %d of %s: the whole error: %s", index, self.name, e)

    def _remote(self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> Callable[..., Any]:
        return self._complete(self._prepare(gm, example_inputs, index))

    def _remote_nonblocking(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int
    ) -> Callable[..., Any]:
        """Encodes here; submits, waits, verifies and loads in the background."""
        assert self.swapper is not None
        try:
            prepared = self._prepare(gm, example_inputs, index)
        except FarmError as e:
            pieces = self._split(gm, example_inputs, index, e)
            return pieces if pieces is not None else self.swapper.failed(index, gm.forward, e)
        return self._keyed(self.swapper.defer(
            index, prepared.key, gm.forward, lambda: self._complete(prepared, eager=gm.forward)
        ), prepared.key)

    def _prepare(self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> _Prepared:
        assert self.client is not None and self.trust is not None
        if not self.trust.loads_anything:
            raise self._untrusted()
        t0 = time.perf_counter()
        inductor_config = self.carried_settings()
        graph = self._encode(gm, example_inputs, index)
        fp = local_fingerprint(device_kind(example_inputs))
        label = f"{self.name} graph {index} from {socket.gethostname()}"
        request = build_request(graph, fp, self.mode, inductor_config, label)
        global_state.record(request.options)
        expected_key = keys.compute_key(request, self.trust.namespace)
        shapes = CaptureShapes.of(gm, [s.name for s in graph.symbols])
        return _Prepared(
            index, request, expected_key, fp, time.perf_counter() - t0, shapes, outcomes.compile_id()
        )

    def _encode(self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> graph_pb2.Graph:
        """The graph in the farm's format. GraphRejected when the format cannot hold it, and
        when the encoder itself fails on it: a bug of this SDK's must not fail a call that a
        local compile serves (with fallback "local" the graph compiles here)."""
        try:
            return encode_graph(gm, example_inputs)
        except UnsupportedGraph as e:
            raise GraphRejected(f"graph cannot be sent to the farm: {e}") from e
        except Exception as e:  # noqa: BLE001 - any other failure is the encoder's bug
            log.warning(
                "torchfarm: graph %d of %s: encoding it failed, a bug in torchfarm's SDK; please "
                "report it with this traceback", index, self.name, exc_info=True,
            )
            raise GraphRejected(
                f"graph cannot be sent to the farm: encoding it failed ({type(e).__name__}: {e}), "
                "a bug in torchfarm's SDK"
            ) from e

    def carried_settings(self) -> dict[str, Any]:
        """The Inductor settings this graph's request carries: the mode's and `options=`
        over the changed global ones. A changed setting the farm refuses keeps the graph
        off it (torchfarm/wire/inductor_settings.py), before anything is sent or run."""
        return changed_settings.carried(self.local.config)

    def _untrusted(self) -> FarmError:
        """Why no graph loads from a farm this client has no key for: that the farm is
        down, when it is (asked once), since trusting it would not help; else that
        nothing it sends could be verified."""
        assert self.client is not None
        if self._down is None:
            try:
                self.client.connect()
                self._down = ""
            except FarmUnavailable as e:
                self._down = str(e)
        if self._down:
            return FarmUnavailable(self._down)
        return ArtifactRejected(untrusted_message(self.client.address), Rejection.UNTRUSTED_FARM)

    def _complete(self, prepared: _Prepared, eager: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """Submit → wait → fetch → verify → load, with progress shown past a few seconds.

        The key leaves the symbols' hints out, so a dynamic graph shares its artifact
        across sizes. The artifact's shape guards (torchfarm/fx/guards.py) are what its compile
        decided from the hints: if one is false at this capture's sizes, the graph is
        submitted again with `specialize_hints`. Called from the backend (before Dynamo
        builds the frame's guards), they join Dynamo's guards. Called later, in the
        background with the graph's `eager` code (wait=False), the frame's guards are
        built, so each call checks them from its size inputs, and a call at sizes they do
        not admit runs `eager`."""
        assert self.client is not None and self.trust is not None
        index, request, expected_key, fp = (
            prepared.index, prepared.request, prepared.key, prepared.fingerprint
        )
        with self.progress.graph(index, expected_key) as track:
            t1 = time.perf_counter()
            try:
                reply, status = self.client.submit_and_wait(request, track, expected_key)
            except RemoteCompileError as e:
                if e.code != JobError.RANK_SPECIFIC or request.per_rank:
                    raise
                log.info("torchfarm: graph %d of %s compiles per rank: %s", index, self.name, e)
                return self._complete(self._again(prepared, per_rank=True), eager)
            if reply.key != expected_key:
                raise ArtifactRejected(
                    f"the farm answered for key {reply.key[:12]}, not this graph's {expected_key[:12]}",
                    Rejection.MISMATCH,
                )
            t3 = time.perf_counter()
            track.set_stage("fetch")
            manifest_bytes, blobs = self.client.fetch(reply.key)
            t4 = time.perf_counter()
            track.set_stage("verify and load")
            manifest = artifact.verify(manifest_bytes, blobs, reply.key, fp, self.trust)
            guards = self._shape_guards(prepared, manifest, reply.key, in_backend=eager is None)
            if guards is None:
                return self._complete(self._again(prepared, specialize_hints=True), eager)
            compiled = artifact.load(manifest, blobs)
            if guards and eager is not None:
                compiled = _checked_call(compiled, eager, self._call_guard(prepared, guards, reply.key))
            t5 = time.perf_counter()
        outcome = "hit" if reply.cache_hit else ("joined" if reply.deduplicated else "miss")
        remote = ""
        if status is not None:
            remote = " (farm: " + stage_timings(status.timings) + ")"
        why = ""
        if not reply.cache_hit and reply.HasField("explanation"):
            why = f" ({reply.explanation.reason}: {reply.explanation.detail})"
        log.info(
            FARM_LINE, index, self.name, outcome, why, reply.key[:12], prepared.encode_s, t3 - t1, remote,
            t4 - t3, t5 - t4, manifest.total_bytes() / 1024, len(manifest.kernels),
        )
        target = f"{fp.device}:{fp.isa if fp.device == 'cpu' else fp.arch}"
        published = report.COMPILED if outcome == "miss" else outcome
        self._publish(
            index, published, key=reply.key, target=target, seconds=t5 - t1,
            compile_seconds=sum(t.seconds for t in status.timings) if status is not None else 0.0,
            kernels=len(manifest.kernels), bytes=manifest.total_bytes(),
        )
        outcomes.record(published)
        outcomes.trace({
            "model": self.name, "graph": index, "where": "farm", "outcome": outcome, "key": reply.key,
            "farm": self.client.address, "target": target, "why_missed": why.strip(" ()"),
            "seconds": {"encode": prepared.encode_s, "submit_and_wait": t3 - t1, "fetch": t4 - t3,
                        "verify_and_load": t5 - t4},
            "stages": [
                {"stage": t.stage, "seconds": t.seconds, "queued_seconds": t.queued_seconds,
                 "kernels": t.kernels, "kernels_hit": t.kernels_hit, "worker": t.worker}
                for t in (status.timings if status is not None else ())
            ],
            "artifact_bytes": manifest.total_bytes(), "kernels": len(manifest.kernels),
        }, prepared.compile_id)
        return self._keyed(compiled, reply.key)

    def _again(self, prepared: _Prepared, **fields: bool) -> _Prepared:
        """The prepared request with `fields` set, and its key."""
        assert self.trust is not None
        again = farm_pb2.CompileRequest()
        again.CopyFrom(prepared.request)
        for name, value in fields.items():
            setattr(again, name, value)
        return dataclasses.replace(prepared, request=again, key=keys.compute_key(again, self.trust.namespace))

    def _shape_guards(
        self, prepared: _Prepared, manifest: Any, key: str, in_backend: bool
    ) -> list[Any] | None:
        """The artifact's shape guards, installed in Dynamo's ShapeEnv `in_backend`; None
        when one is false at this capture's sizes and the request did not yet specialize
        on them."""
        shapes = prepared.shapes
        try:
            guards = shapes.read(manifest.guards)
            false = shapes.false_ones(guards)
            if false and not prepared.request.specialize_hints and shapes.symbols:
                log.info(
                    "torchfarm: graph %d of %s: the shared artifact %s guards %s, false at "
                    "these sizes; compiling for them",
                    prepared.index, self.name, key[:12], false[0],
                )
                return None
            if false:
                raise GuardError(f"its shape guard {false[0]} is false at this capture's sizes")
            if in_backend:
                shapes.install(guards)
        except GuardError as e:
            raise rejected(Rejection.GUARDS, f"artifact {key[:12]} refused: {e}") from e
        return guards

    @staticmethod
    def _call_guard(prepared: _Prepared, guards: list[Any], key: str) -> CallGuard:
        try:
            return prepared.shapes.call_guard(guards)
        except GuardError as e:
            raise rejected(Rejection.GUARDS, f"artifact {key[:12]} refused: {e}") from e

    def _prewarm(self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> Callable[..., Any]:
        """Compiles the graph on the farm for `self.target`, which this process is not,
        and runs it eagerly here (sdk/fleet.py; docs/targets.md)."""
        from sdk import fleet

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
            if self.client is None:
                raise ConfigError(f"compiling for {target} needs a farm: pass remote=")
            inductor_config = self.carried_settings()
            graph = fleet.retarget_graph(self._encode(gm, example_inputs, index), target)
            workers = fleet.fleet_fingerprints(self.client, target)
            builds = fleet.usable_builds(workers, torch.__version__, target)
            label = f"{self.name} graph {index} from {socket.gethostname()} (prewarm {target})"
            for fp in builds:
                request = build_request(graph, fp, self.mode, inductor_config, label)
                global_state.record(request.options)
                assert self.trust is not None
                reply, _ = self.client.submit_and_wait(
                    request, key=keys.compute_key(request, self.trust.namespace)
                )
                log.info(
                    "torchfarm: graph %d of %s for %s (torch %s): %s key=%s",
                    index, self.name, target, fp.torch_version,
                    "hit" if reply.cache_hit else "compiled", reply.key[:12],
                )
                self._publish(
                    index, report.HIT if reply.cache_hit else report.COMPILED, key=reply.key,
                    target=str(target),
                )
        except FarmError as e:
            if self.settings.fallback != "local" or not e.fallback:
                raise
            FALLBACKS.labels(error=type(e).__name__).inc()
            log.warning(
                "torchfarm: graph %d of %s was not compiled for %s (%s): %s",
                index, self.name, target, type(e).__name__, e,
            )
            self._publish(index, report.FAILED, target=str(target), error=f"{type(e).__name__}: {e}")
        outcomes.record(outcomes.EAGER)
        return gm.forward


def _reason(e: FarmError) -> str:
    """A fallback's reason, for its graph's line: "FarmUnavailable: farm at ... did not answer"."""
    code = f" [{e.code}]" if e.code else ""
    return f"{type(e).__name__}{code}: {e}"


_warned_once: set[str] = set()
"""What this process was warned of once: a setting, not a model's, is said once."""
_warned_lock = threading.Lock()


def _warn_once(what: str, message: str, *args: object) -> None:
    with _warned_lock:
        if what in _warned_once:
            return
        _warned_once.add(what)
    log.warning(message, *args)


WARNED_CHARS = 600
"""A longer error is warned of by its first line: a compile error's carries its cause,
the lines after it Inductor's IR, kilobytes of it."""


def _warned_text(message: str) -> str:
    """The message, or, when it is long and runs over lines, its first line and a count."""
    first, _, rest = message.partition("\n")
    if not rest or len(message) <= WARNED_CHARS:
        return message
    more = rest.count("\n") + 1
    return (
        f"{first[:WARNED_CHARS]} [{more} more lines: the 'sdk' logger at DEBUG logs the whole error]"
    )
