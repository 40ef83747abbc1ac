"""Client side of a farm artifact: put the shipped C++ kernels where the local Inductor
will look for them, then deserialize the artifact without compiling anything.

The kernel specs and why kernels travel as specs are in torchfarm/fx/cpp_kernels.py.

Torch internals relied on here, pinned for torch 2.13.0 (tests/unit/test_compiler_loader.py):
- `cpu_vec_isa.valid_vec_isa_list()` is `functools.cache`d and honours
  `config.cpp.vec_isa_ok`; see `_skip_isa_probe`.
- `AOTCompiledArtifact.deserialize` loads the Inductor artifact; every C++ build it
  would start goes through `CppBuilder.build` (counted by `count_kernel_builds`).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from sdk.errors import ArtifactRejected, ConfigError
from torchfarm.files import foreign, write_atomic
from torchfarm.fx import autotune
from torchfarm.fx import meshes as fx_meshes
from torchfarm.fx.cpp_kernels import KernelSpec, KernelSpecError, local_outputs
from torchfarm.fx.hooks import count_kernel_builds
from torchfarm.fx.internals import resolve
from torchfarm.wire.codes import Rejection

log = logging.getLogger(__name__)


def check_private_cache() -> None:
    """ConfigError unless the directories Inductor writes the artifact into, and imports
    and dlopens it from, belong to this user (or root) and no one else may write them.

    The SDK verifies the artifact's bytes, but Inductor imports whatever file sits at the
    wrapper's path (it writes one only where none exists) and dlopens kernels lazily: in
    a directory another user can write, such as a `/tmp/torchinductor_<user>` that user
    made first, their code would run in place of the verified code. A local
    `torch.compile` would load from the same directory, so this is no fallback case."""
    dirs = [resolve("inductor_cache_dir")()]
    if os.environ.get("TRITON_CACHE_DIR"):
        dirs.append(os.environ["TRITON_CACHE_DIR"])
    for directory in dirs:
        try:
            st = os.stat(directory)
        except FileNotFoundError:
            continue  # Inductor makes it, as this user
        if foreign(st, root_ok=True, private_group=True):
            raise ConfigError(
                f"{directory} is writable by others or owned by another user (uid {st.st_uid}, "
                f"mode {stat.S_IMODE(st.st_mode):o}): code planted there would run in place of the "
                "farm's verified artifact. Point TORCHINDUCTOR_CACHE_DIR (and TRITON_CACHE_DIR) "
                "at a directory of your own, or chmod go-w it"
            )


def install_kernels(
    kernels: Iterable[tuple[bytes, bytes]], toolchain: dict[str, Any] | None = None
) -> int:
    """Writes each (spec, binary) at the path the local Inductor will load it from, for the
    current TORCHINDUCTOR_CACHE_DIR. Returns how many files were written (identical files
    already in place are skipped). `toolchain` is the manifest's record of the worker's
    probes: with it, keying the kernels starts no compiler (torchfarm/fx/vecisa.py, torchfarm/fx/toolchain.py)."""
    _seed_probes(toolchain or {})
    installed = 0
    for source, binary in kernels:
        try:
            spec = KernelSpec.from_bytes(source)
        except KernelSpecError as e:
            raise ArtifactRejected(str(e), code=Rejection.BAD_KERNEL) from e
        try:
            key, targets = local_outputs(spec)
        except KernelSpecError as e:
            raise ArtifactRejected(str(e), code=Rejection.BAD_KERNEL) from e
        except RuntimeError as e:
            raise ArtifactRejected(str(e), code=Rejection.KERNEL_INSTALL) from e
        if len(targets) != spec.outputs:
            raise ArtifactRejected(
                f"kernel {key}: local Inductor builds {len(targets)} outputs, artifact has "
                f"{spec.outputs}; it was built with different options",
                code=Rejection.KERNEL_INSTALL,
            )
        if _write_if_different(targets[spec.output], binary):
            installed += 1
    return installed


def install_autotune_records(toolchain: dict[str, Any]) -> int:
    """Writes the worker's Triton autotune records into the local autotune cache, keyed as
    this Inductor looks them up (torchfarm/fx/autotune.py), so a kernel loaded from the
    artifact runs its tuned config without benchmarking. Returns how many were written."""
    try:
        records = autotune.from_toolchain(toolchain)
    except autotune.BadRecord as e:
        raise ArtifactRejected(str(e), code=Rejection.MALFORMED) from e
    return autotune.install(records) if records else 0


def _seed_probes(toolchain: dict[str, Any]) -> None:
    from torchfarm.fx import toolchain as local_toolchain
    from torchfarm.fx import vecisa

    local_toolchain.seed_inductor()
    if "vec_isa" in toolchain:
        try:
            vecisa.seed(toolchain["vec_isa"])
        except vecisa.ToolchainMismatch as e:
            raise ArtifactRejected(str(e), code=Rejection.ISA) from e
    else:  # a manifest from a worker that recorded no probe
        _skip_isa_probe()


def _skip_isa_probe() -> None:
    """Picks the vector ISA without Inductor's probe build.

    Every kernel key holds the ISA's flags, so `load_async` calls `pick_vec_isa()`, whose
    `valid_vec_isa_list()` (cached for the process) proves each ISA the CPU reports by
    compiling a test program and dlopen'ing it in a child process: seconds of compiler
    time on a machine whose cache dir is empty. The artifact's fingerprint already
    matched this machine's ISA, compiler and CPU model, whose worker passed that very
    probe, so we answer it with `config.cpp.vec_isa_ok=True` ("use the ISAs the CPU
    reports, untested"). Once per process, and only when the user set nothing.
    """
    config, valid_vec_isa_list = resolve("inductor_config"), resolve("valid_vec_isa_list")

    if config.cpp.vec_isa_ok is None:
        with config.patch({"cpp.vec_isa_ok": True}):
            valid_vec_isa_list()


def _write_if_different(path: str, data: bytes) -> bool:
    try:
        if os.path.getsize(path) == len(data):
            with open(path, "rb") as f:
                if f.read() == data:
                    return False
    except OSError:
        pass
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    # A concurrent reader sees the old file or the whole new one, never a torn .so.
    write_atomic(path, data, 0o755)
    return True


def load_compiled(payload: bytes) -> Callable[..., Any]:
    """Deserializes an `AOTCompiledArtifact`; the result can be returned from a Dynamo
    backend and runs forward and backward. Install the kernels first, or every C++
    kernel is rebuilt here (logged as a warning)."""
    AOTCompiledArtifact = resolve("AOTCompiledArtifact")

    t0 = time.perf_counter()
    with count_kernel_builds() as builds, fx_meshes.meshes_at_this_rank():
        try:
            artifact = AOTCompiledArtifact.deserialize(payload)
        except Exception as e:
            raise ArtifactRejected(f"cannot deserialize artifact: {e!r}", code=Rejection.DESERIALIZE) from e
    if builds.kernels:
        log.warning(
            "loading the artifact rebuilt %d C++ kernels locally: their shipped binaries "
            "did not match this installation's kernel keys",
            len(builds.kernels),
        )
    log.debug("artifact deserialized in %.3fs", time.perf_counter() - t0)
    return cast("Callable[..., Any]", artifact)


