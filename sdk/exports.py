"""`sdk.export`: an AOTInductor package for inference, built by the farm.

    pkg = sdk.export(model, (x,), remote="grpc://farm:50051")
    runner = pkg.load()            # torch._inductor.aoti_load_package(pkg.path)
    y = runner(x)

The model is exported here with `torch.export.export`; the program travels as the
farm's graph format plus raw weight bytes (sdk/export_codec.py); a worker for the exact
target rebuilds it and runs `aoti_compile_and_package`. The package comes back as a
signed artifact and is written where the user asked only after it verified
(sdk/artifact.py): signature, key, namespace, kind, fingerprint and digest.

The fingerprint it must carry is the target's:
- `target=None` (or this machine's own target): this machine's fingerprint, as for
  `sdk.compile`, and the package can be loaded here;
- another exact target ("cpu:avx2", "cuda:sm_90"): the fingerprint of the fleet's
  live workers for that target (their heartbeat carries their build), the same one the
  request asked for. The signature still covers key, namespace, content and that
  fingerprint, so a package is accepted only if a pinned farm key vouched that it was
  built for that fleet. It is written, not loaded: `load()` refuses it here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sdk import artifact, changed_settings, fleet
from sdk import settings as sdk_settings
from sdk.backend import build_request
from sdk.client import CompileClient, FarmClient, parse_address
from sdk.errors import ArtifactRejected, ConfigError, GraphRejected, RequestTooLarge
from sdk.export_codec import encode_export
from sdk.trust import Trust, untrusted_message
from torchfarm.files import write_atomic
from torchfarm.fx import internals
from torchfarm.fx.encode import UnsupportedGraph
from torchfarm.fx.fingerprint import Fingerprint, device_kind, local_fingerprint, local_target, resolve
from torchfarm.wire import keys
from torchfarm.wire.codes import Reason, Rejection
from torchfarm.wire.manifest import EXPORT
from torchfarm.wire.targets import Target, TargetError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportedPackage:
    """A verified AOTInductor package on disk. `os.fspath(pkg)` is its path."""

    path: Path
    key: str
    target: Target
    cache_hit: bool

    def __fspath__(self) -> str:
        return str(self.path)

    def load(self) -> Any:
        """`torch._inductor.aoti_load_package(path)`; ConfigError for another target's package."""
        try:
            here = local_target(self.target.device)
        except TargetError as e:
            here = None
            why = str(e)
        if here != self.target:
            raise ConfigError(
                f"the package at {self.path} is built for {self.target}; this machine is "
                f"{here if here is not None else why}: load it on a {self.target} machine"
            )
        return internals.resolve("aoti_load_package")(str(self.path))


def export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    *,
    kwargs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    target: str | Target | None = None,
    remote: str | None = None,
    path: str | os.PathLike[str] | None = None,
    inductor_configs: dict[str, Any] | None = None,
) -> ExportedPackage:
    """Exports `model` at `args`/`kwargs` (as `torch.export.export`, with
    `dynamic_shapes`), has the farm at `remote` (default `TORCHFARM_REMOTE`) build the
    AOTInductor package for `target` (None: this machine), verifies it and writes it at
    `path` (default: the user cache, `~/.cache/torchfarm/exports/<key>.pt2`).
    `inductor_configs` over the changed global Inductor settings travel as
    `sdk.compile`'s do (sdk/changed_settings.py); a changed one the farm refuses raises
    GraphRejected naming it.

    Raises `sdk.errors.FarmError` subclasses: there is no local fallback, since the
    point of the call is the farm's package."""
    settings = sdk_settings.load()
    settings = dataclasses.replace(settings, remote=remote or settings.remote)
    if not settings.remote:
        raise ConfigError("sdk.export needs a farm: pass remote= or set TORCHFARM_REMOTE")
    if not isinstance(args, tuple):
        raise ConfigError(f"args must be a tuple, as for torch.export.export, not {type(args).__name__}")
    if path is not None and not os.fspath(path).endswith(".pt2"):
        raise ConfigError(f"path must end in .pt2 (AOTInductor's package name), not {path}")
    # The user's changed global settings too, as sdk.compile reads them.
    carried = changed_settings.carried(inductor_configs or {})
    client = FarmClient(settings.remote, settings)
    try:
        trust = Trust.from_settings(settings, parse_address(settings.remote))
        if not trust.loads_anything:
            raise ArtifactRejected(untrusted_message(client.address), Rejection.UNTRUSTED_FARM)
        program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
        try:
            graph, spec = encode_export(program)
        except UnsupportedGraph as e:
            raise GraphRejected(f"the exported program cannot be sent to the farm: {e}") from e
        wanted, fp = _target_build(client, target, [*args, *(kwargs or {}).values()])
        if wanted.device != "cpu":  # the graph's devices become the target's
            graph = fleet.retarget_graph(graph, wanted)
        label = f"export {type(model).__qualname__} from {socket.gethostname()} for {wanted}"
        request = build_request(graph, fp, "", carried, label)
        request.export.CopyFrom(spec)
        size = request.ByteSize()
        if size > settings.max_message_bytes:
            raise RequestTooLarge(
                f"the exported model is {size} bytes with its weights; a farm request carries "
                f"at most {settings.max_message_bytes} (TORCHFARM_MAX_MESSAGE_BYTES), and the "
                "coordinator's own limit may be lower", Reason.REQUEST_TOO_LARGE,
            )
        expected = keys.compute_key(request, trust.namespace)
        reply, _ = client.submit_and_wait(request, key=expected)
        if reply.key != expected:
            raise ArtifactRejected(
                f"the farm answered for key {reply.key[:12]}, not this export's {expected[:12]}",
                Rejection.MISMATCH,
            )
        manifest_bytes, blobs = client.fetch(reply.key)
        manifest = artifact.verify(manifest_bytes, blobs, reply.key, fp, trust, kind=EXPORT)
        out = Path(path) if path is not None else _default_path(reply.key)
        _write(out, blobs[manifest.payload.digest])
        log.info("torchfarm: export %s for %s: %s key=%s, %d bytes at %s", type(model).__qualname__,
                 wanted, "hit" if reply.cache_hit else "built", reply.key[:12],
                 manifest.payload.size, out)
        return ExportedPackage(path=out, key=reply.key, target=wanted, cache_hit=reply.cache_hit)
    finally:
        client.close()


def _target_build(client: CompileClient, target: str | Target | None, inputs: list[Any]) -> tuple[Target, Fingerprint]:
    """The exact target and the fingerprint the package must carry (module docstring)."""
    try:
        here = local_target(device_kind(inputs))
        wanted = here if target is None else resolve(target)
    except TargetError as e:
        raise ConfigError(str(e)) from e
    if not wanted.exact:
        try:
            wanted = local_target(wanted.device)
        except TargetError as e:
            raise ConfigError(str(e)) from e
    if wanted == here:
        return wanted, local_fingerprint(device_kind(inputs))
    builds = fleet.usable_builds(fleet.fleet_fingerprints(client, wanted), torch.__version__, wanted)
    chosen = sorted(builds, key=lambda fp: sorted(fp.to_dict().items()))[0]
    if len(builds) > 1:
        log.warning("torchfarm: %d builds serve %s; exporting for %s (torch %s)",
                    len(builds), wanted, chosen.compiler, chosen.torch_version)
    return wanted, chosen


def _default_path(key: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchfarm" / "exports" / f"{key}.pt2"


def _write(out: Path, data: bytes) -> None:
    """Atomically: a reader never sees half a package."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, data)
