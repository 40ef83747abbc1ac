"""Precompiled frames: a farm hit that runs the model with no Dynamo tracing.

The first call of an `sdk.compile`d module computes its key without tracing
(sdk/precompile_key.py) and asks the farm for a package under it:

- **hit**: the package's manifest verifies under a pinned *precompile* key
  (`precompile_trusted_keys`), each graph artifact it names verifies under the farm's
  keys and loads as on a plain hit, and only then is its payload (Dynamo's
  `_DynamoCacheEntry`: the frames' transformed bytecode and guards, a pickle) loaded
  and installed on the model's code objects (`torch._dynamo.package.CompilePackage`).
  Dynamo checks the installed guards on the call; frames that pass run with no
  tracing, and a guard that fails makes Dynamo trace that frame as usual.
- **miss, or anything refused**: the normal path (trace, key each graph, farm), with
  one log line saying why. With a `precompile_key_file`, once that first call has
  run, its frames are packaged, signed with that key and uploaded.

Who builds the package is the client that ran the model: the farm never runs user
code, so it cannot vouch for bytecode. The coordinator stores the package unread
(services/coordinator/precompiled.py) and clients load only what a key they pinned
signed: the farm's signature never makes a package loadable.
"""

from __future__ import annotations

import functools
import logging
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sdk import artifact, precompile_key
from sdk.backend import FarmBackend
from sdk.errors import ArtifactRejected, ConfigError, FarmError, GraphRejected
from sdk.settings import SDKSettings
from sdk.trust import Trust, pinned_keys
from torchfarm.fx.fingerprint import Fingerprint, device_kind, local_fingerprint
from torchfarm.fx.internals import resolve
from torchfarm.trust.signing import Signer
from torchfarm.v1.farm_pb2 import PrecompiledRecord
from torchfarm.wire.codes import Reason
from torchfarm.wire.manifest import PRECOMPILED, BlobRef, Manifest, blob_digest

log = logging.getLogger(__name__)

_Record = Callable[[], PrecompiledRecord]
"""Builds the key's record (sdk/precompile_key.py `record`) when it is needed."""

_DROPPED = "is dropped with caching_precompile=True"


class _QuietDroppedGuards(logging.Filter):
    """Dynamo warns once per guard that packaging drops (ID and module matches): noise
    for every model, so the SDK's one line says what matters instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _DROPPED not in str(record.msg)


_QUIET = _QuietDroppedGuards()


def enabled(settings: SDKSettings) -> bool:
    return bool(settings.remote) and bool(
        settings.precompile_key_file or settings.precompile_trusted_keys_file or settings.precompile_trusted_keys
    )


def compile_packaged(fn: Any, backend: FarmBackend, kwargs: dict[str, Any]) -> Any:
    """`torch.compile` with Dynamo recording its frames in a package
    (`caching_precompile`): what the normal path uploads."""
    logging.getLogger("torch._dynamo.guards").addFilter(_QUIET)  # once: the same filter
    with resolve("dynamo_config").patch(caching_precompile=True):
        return torch.compile(fn, backend=backend, **kwargs)


class Refused(Exception):
    """The package cannot serve this call; the message says why."""


@dataclass
class _Loaded:
    """A graph artifact as `CompilePackage.install` wants a backend."""

    fn: Callable[..., Any]

    def after_deserialization(self) -> Callable[..., Any]:
        return self.fn


class Gate:
    """Stands in for an `OptimizedModule`'s forward for its first call only."""

    def __init__(self, compiled: torch.nn.Module, model: torch.nn.Module, backend: FarmBackend):
        self.compiled = compiled
        self.model = model
        self.backend = backend
        self.forward = compiled.forward
        self._lock = threading.Lock()
        settings = backend.settings
        try:
            self.pinned = pinned_keys(settings.precompile_trusted_keys_file, settings.precompile_trusted_keys)
            self.signer = Signer.from_file(settings.precompile_key_file) if settings.precompile_key_file else None
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the precompile keys: {e}") from e
        compiled.forward = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self.compiled.forward is not self:
                return self.forward(*args, **kwargs)
            self.compiled.forward = self.forward
            return self._first(args, kwargs)

    def _first(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        name = self.backend.name
        try:
            key, fp, record = self._key(args, kwargs)
        except precompile_key.Ineligible as e:
            log.info("torchfarm: %s takes the normal path: not precompilable (%s)", name, e)
            return self.forward(*args, **kwargs)
        if self.pinned:
            t0 = time.perf_counter()
            try:
                frames = self._install(key, fp, record)
            except (Refused, FarmError) as e:
                log.info("torchfarm: %s takes the normal path: precompiled %s key=%s", name, e, key[4:16])
            else:
                return self._run_hit(key, frames, time.perf_counter() - t0, args, kwargs)
        result = self._normal(args, kwargs)
        if self.signer is not None:
            self._upload(key, fp, record)
        return result

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Fingerprint, _Record]:
        """The key, the fingerprint, and the key's record for the farm, which only a miss
        or an upload builds."""
        if self.backend.target is not None or self.backend.trust is None:
            raise precompile_key.Ineligible("it compiles for another target")
        parts = precompile_key.components(self.model, args, kwargs)
        fp = local_fingerprint(device_kind([*self.model.parameters(), *args]))
        build = fp.to_dict()
        try:
            inductor = self.backend.carried_settings()
        except GraphRejected as e:
            raise precompile_key.Ineligible(str(e)) from e
        options = {"mode": self.backend.mode, "inductor": inductor}
        key = precompile_key.precompiled_key(parts, build, options, self.backend.trust.namespace)
        return key, fp, functools.partial(precompile_key.record, self.model, parts, build, options)

    def _normal(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Dynamo records the frames it traces in the package only with this set.
        with resolve("dynamo_config").patch(caching_precompile=True):
            return self.forward(*args, **kwargs)

    def _run_hit(self, key: str, frames: int, load_s: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        counters = resolve("frame_counters")
        before = counters["frames"]["total"]
        result = self.forward(*args, **kwargs)
        traced = counters["frames"]["total"] - before
        if traced:
            log.info(
                "torchfarm: %s: precompiled package %s loaded, but Dynamo traced %d frame(s): "
                "their guards failed at this call", self.backend.name, key[4:16], traced,
            )
        else:
            log.info(
                "torchfarm: %s: precompiled hit key=%s | fetch+verify+load %.2fs | %d frames, "
                "no Dynamo tracing", self.backend.name, key[4:16], load_s, frames,
            )
        return result

    def _install(self, key: str, fp: Fingerprint, record: _Record) -> int:
        """Fetches and verifies the package and its graphs, then installs its frames;
        Refused or FarmError when it cannot serve."""
        CompilePackage, _DynamoCacheEntry = resolve("CompilePackage"), resolve("DynamoCacheEntry")

        client, trust = self.backend.client, self.backend.trust
        assert client is not None and trust is not None
        try:
            manifest_bytes, blobs = client.fetch(key)
        except FarmError as e:
            if e.code != Reason.NOT_FOUND:
                raise
            raise Refused(f"miss ({self._why_missed(key, record)})") from e
        precompile_trust = Trust(keys=self.pinned, namespace=trust.namespace, unsigned=False,
                                 keys_from="precompile keys")
        try:
            manifest = artifact.verify(manifest_bytes, blobs, key, fp, precompile_trust, kind=PRECOMPILED)
        except ArtifactRejected as e:
            raise Refused(f"package refused ({e.code}): {e}") from e
        backends: dict[Any, _Loaded] = {}
        for backend_id, graph_key in manifest.graphs.items():
            graph_bytes, graph_blobs = client.fetch(graph_key)
            graph = artifact.verify(graph_bytes, graph_blobs, graph_key, fp, trust)
            backends[backend_id] = _Loaded(artifact.load(graph, graph_blobs))
        # Loaded only now: a pinned key signed these exact bytes for this key and machine.
        try:
            entry = pickle.loads(blobs[manifest.payload.digest])  # noqa: S301
            if not isinstance(entry, _DynamoCacheEntry):
                raise Refused(f"package refused: its payload is a {type(entry).__qualname__}")
            package = CompilePackage(self.model.forward, entry)
        except Refused:
            raise
        except Exception as e:  # a module or name the package needs that this process lacks
            raise Refused(f"package does not fit this model ({type(e).__name__}: {e})") from e
        try:
            package.install(backends)
        except (RuntimeError, KeyError, ValueError, AttributeError) as e:
            package.uninstall()  # no half-installed frames: the normal path traces them all
            raise Refused(f"package does not fit this model ({e})") from e
        return len(entry.codes)

    def _why_missed(self, key: str, record: _Record) -> str:
        """The farm's explanation of the miss; the key's coverage where it gives none."""
        client = self.backend.client
        assert client is not None
        try:
            found = client.explain_precompiled(key, record())
        except FarmError as e:
            log.debug("torchfarm: no explanation of precompiled miss %s: %s", key[4:16], e)
            return "no package for this model's code, structure, parameters, inputs and build"
        return f"{found.reason}: {found.detail}"

    def _upload(self, key: str, fp: Fingerprint, record: _Record) -> None:
        try:
            manifest, blobs = self._package(key, fp)
            client = self.backend.client
            assert client is not None and self.signer is not None
            client.put_precompiled(self.signer.sign(manifest).to_json(), blobs, record())
        except (Refused, FarmError) as e:
            log.info("torchfarm: %s: no precompiled package uploaded: %s", self.backend.name, e)
            return
        log.info("torchfarm: %s: precompiled package uploaded key=%s (%d frames' graphs)",
                 self.backend.name, key[4:16], len(manifest.graphs))

    def _package(self, key: str, fp: Fingerprint) -> tuple[Manifest, dict[str, bytes]]:
        package = getattr(self.compiled.dynamo_ctx, "_package", None)
        if package is None or not package.is_initialized():
            raise Refused("Dynamo recorded no package")
        entry = package.cache_entry()
        if any(code.bypassed for code in entry.codes):
            raise Refused("Dynamo could not package a frame")
        graphs = {}
        for backend_id, fn in package.cached_backends.items():
            graph_key = self.backend.farm_key(fn)
            if graph_key is None:
                raise Refused("a graph was compiled here, not on the farm")
            graphs[str(backend_id)] = graph_key
        if not graphs:
            raise Refused("the model has no compiled graph")
        payload = pickle.dumps(entry)
        assert self.backend.trust is not None
        manifest = Manifest(
            key=key, fingerprint=fp.to_dict(), payload=BlobRef(blob_digest(payload), len(payload)),
            worker=self.backend.name, created=time.time(), tenant=self.backend.trust.namespace,
            kind=PRECOMPILED, graphs=graphs,
        )
        return manifest, {manifest.payload.digest: payload}


def attach(compiled: Any, model: Any, backend: FarmBackend) -> Any:
    """Puts the first-call gate on `compiled` (what torch.compile returned for a module)."""
    if isinstance(compiled, torch.nn.Module) and isinstance(model, torch.nn.Module):
        Gate(compiled, model, backend)
    else:
        log.info("torchfarm: %s is not a module: it takes the normal path (not precompilable)", backend.name)
    return compiled

