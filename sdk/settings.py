"""The SDK's settings: TORCHFARM_* variables, overridden by `sdk.compile`'s arguments."""

from __future__ import annotations

from dataclasses import dataclass

from sdk.errors import ConfigError
from torchfarm.settings import PREFIX, SettingsError, from_env


@dataclass(frozen=True)
class SDKSettings:
    remote: str = ""
    """The farm's address, "grpc://host:port"; empty means compile locally."""
    fallback: str = "local"
    """"local": compile a graph locally when the farm cannot; "error": raise instead."""
    split_refused: bool = True
    """With fallback "local", a graph with calls the farm refuses is split at them: they
    run eagerly and the rest compiles on the farm (sdk/split.py). False compiles such a
    graph whole, locally, keeping the fusions across those calls."""
    connect_timeout_s: float = 3.0
    """How long to wait for the farm's channel to connect before falling back."""
    rpc_timeout_s: float = 30.0
    """Deadline of each unary call (submit, job status)."""
    compile_timeout_s: float = 900.0
    """How long to wait for one graph's compile on the farm, queueing included."""
    fetch_timeout_s: float = 300.0
    """Deadline for streaming one artifact."""
    max_message_bytes: int = 64 * 1024 * 1024
    """gRPC send and receive limit: the coordinator's send limit (its own
    TORCHFARM_MAX_MESSAGE_BYTES); it receives no more than its TORCHFARM_MAX_REQUEST_BYTES
    and a margin."""
    direct_downloads: bool = True
    """Ask for pre-signed blob URLs and download blobs directly from the store, where the
    farm's store offers them (object storage); the coordinator's stream otherwise."""
    blob_cache_dir: str = "~/.cache/torchfarm/blobs"
    """This machine's shared cache of directly downloaded blobs (sdk/blobcache.py), so
    the processes of one machine download each blob once; "" turns it off."""
    blob_cache_bytes: int = 16 * 1024 * 1024 * 1024
    """Size bound of blob_cache_dir; least recently used blobs go first."""
    max_artifact_bytes: int = 2 * 1024 * 1024 * 1024
    """Largest artifact the SDK accepts; a bigger manifest is refused before streaming."""
    kernel_timeout_s: float = 180.0
    """Deadline of one CompileKernel call (queueing and the Triton compile included)."""
    token: str = ""
    """This tenant's token (`tf1.<namespace>.<secret>`), sent on every call as
    `authorization: Bearer`. Empty on a farm without authentication."""
    tls_ca_file: str = ""
    """PEM CA bundle that signed the farm's certificate. Set it, or use a "grpcs://"
    address (system roots), to talk TLS."""
    tls_cert_file: str = ""
    """PEM client certificate, for a farm that requires mutual TLS."""
    tls_key_file: str = ""
    """PEM private key of tls_cert_file."""
    trusted_keys_file: str = ""
    """The farm's artifact signing keys, JSON {key id: base64 public key}. With any key
    pinned (here or in trusted_keys), only artifacts signed by one of them are loaded."""
    trusted_keys: str = ""
    """More pinned keys, inline: "id=base64,id=base64"."""
    trust_unsigned: str = ""
    """Development farms whose unsigned artifacts may load, named exactly:
    "grpc://127.0.0.1:50051" (a comma-separated list). Only for a farm for which no key
    is known (pinned above, or published by `torchfarm up` on this machine); every other
    farm's artifacts load only with a valid signature (sdk/trust.py)."""
    wake_timeout_s: float = 120.0
    """How long to wait for a live worker of the graph's target before falling back: a
    submit answered NO_WORKER is retried (sdk/wake.py), and a job queued while no live
    worker takes its queue (a pool starting or scaled to zero, or every worker gone) is
    watched this long (sdk/client.py); 0: at once."""
    reconnect_timeout_s: float = 60.0
    """How long a compile waits for a farm that stopped answering while it compiled (a
    coordinator restarting, or the farm gone) before falling back; the job itself lives
    on in the farm's Redis, so a farm back within it answers the compile."""
    max_resubmits: int = 2
    """Times a graph is submitted again when its job vanished from the farm (a Redis
    restart); each submit is idempotent on the key."""
    progress_after_s: float = 2.5
    """A farm compile shows progress (sdk/progress.py) once it has run this long, so
    cache hits print nothing extra."""
    progress_every_s: float = 5.0
    """Seconds between progress log lines when stderr is not a terminal."""
    precompile_key_file: str = ""
    """This client's precompile signing key (Ed25519, PEM; `torchfarm keygen`). Set, a
    model whose first call took the normal path uploads its precompiled frames, signed
    with it (sdk/precompile.py; docs/sdk.md)."""
    precompile_trusted_keys_file: str = ""
    """Precompile keys whose packages this client loads, JSON {key id: base64 public
    key}. With any pinned (here or inline), the first call of an `sdk.compile`d module
    looks for a precompiled package and, on a hit, runs with no Dynamo tracing."""
    precompile_trusted_keys: str = ""
    """More pinned precompile keys, inline: "id=base64,id=base64"."""

    def __post_init__(self) -> None:
        for name in (*_POSITIVE, *_NOT_NEGATIVE):
            value = getattr(self, name)
            if value < 0 or (value == 0 and name in _POSITIVE):
                bound = "above 0" if name in _POSITIVE else "0 or more"
                raise ConfigError(f"{name} ({PREFIX}{name.upper()}) must be {bound}, not {value}")


_POSITIVE = (
    "connect_timeout_s", "rpc_timeout_s", "compile_timeout_s", "fetch_timeout_s", "kernel_timeout_s",
    "max_message_bytes", "max_artifact_bytes", "progress_every_s",
)
"""Settings a 0 would make meaningless: a timeout of 0 s sent every graph to a local
compile, reported as an outage."""
_NOT_NEGATIVE = ("blob_cache_bytes", "wake_timeout_s", "reconnect_timeout_s", "max_resubmits", "progress_after_s")


def load() -> SDKSettings:
    """The settings from the TORCHFARM_* variables; a bad value raises ConfigError naming
    its variable, so `except sdk.ConfigError` catches every bad configuration."""
    try:
        return from_env(SDKSettings)
    except SettingsError as e:
        raise ConfigError(str(e)) from None
