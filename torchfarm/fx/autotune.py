"""Triton autotuning results, carried from the worker that found them to the client.

A Triton kernel compiled with more than one config is benchmarked at its first launch,
config by config, and Inductor keeps the winner in its local autotune cache: a record
keyed by the kernel's source file name, the torch build and
`torch.compiler.config.cache_key_tag`. A local warm start reads it from disk, PyTorch's
remote cache from Redis. A farm artifact carried the kernels' binaries and not these
records, so on torch 2.11 and 2.12, whose bundles keep every config of a kernel (2.13
keeps only the winners), a farm hit benchmarked its kernels again at their first launch,
on the client's GPU.

So the worker notes every Triton kernel it loads while it compiles (`noting`) and reads
the record of each that autotuned (`Noted.results`); the manifest carries them
(`toolchain["autotune"]`, torchfarm/wire/manifest.py), and the client writes each into
its own cache, under its own key, before it loads the artifact (`install`). A record is
a small JSON object (a config's block sizes, warps and stages, and the hash of the configs
it was picked from), so a hit benchmarks nothing and runs no code it carries.

Torch internals relied on (torchfarm/fx/internals.py): `CachingAutotuner.precompile`,
called in the compiling process for every Triton kernel; a kernel's `filename` and
`save_cache_hook` (its AutotuneCache's bound `save`); `AutotuneCache.create` and
`_read`; a cache's `local_cache`, a (cache, key) pair whose cache has `put(key, value)`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
from collections.abc import Iterator
from typing import Any

from torchfarm.fx.internals import resolve

log = logging.getLogger(__name__)

KERNEL_PATH = re.compile(r"[a-z0-9]{2}/[a-z0-9]{16,128}\.py")
"""A Triton kernel's source file, relative to Inductor's cache dir: `<2 chars>/<hash>.py`."""

MAX_RECORDS = 4096
"""Records one artifact may carry: more than any graph has Triton kernels."""

MAX_FIELDS = 64
"""Fields one record may hold (a config's meta-parameters and Inductor's own few)."""


class BadRecord(ValueError):
    """An autotune record that is not the small JSON object Inductor writes."""


class Noted:
    """The Triton kernels loaded while `noting` was open."""

    def __init__(self) -> None:
        self.kernels: list[Any] = []

    def results(self) -> list[dict[str, Any]]:
        """{"kernel": its path under the cache dir, "best": its record} for each noted
        kernel that has an autotune record, by path."""
        if not self.kernels:  # a CPU compile: no Triton kernel
            return []
        read = resolve("AutotuneCache._read")
        root = resolve("inductor_cache_dir")()
        found: dict[str, dict[str, Any]] = {}
        for kernel in self.kernels:
            cache = getattr(getattr(kernel, "save_cache_hook", None), "__self__", None)
            filename = getattr(kernel, "filename", None)
            if cache is None or not isinstance(filename, str):
                continue  # one config and no coordinate descent: nothing was tuned
            path = os.path.relpath(filename, root)
            record = read(cache)
            if not KERNEL_PATH.fullmatch(path) or not isinstance(record, dict):
                continue
            try:
                found[path] = _checked_best(record)
            except BadRecord as e:
                log.warning("autotune record of %s not carried: %s", path, e)
        return [{"kernel": path, "best": found[path]} for path in sorted(found)]


@contextlib.contextmanager
def noting() -> Iterator[Noted]:
    """Notes each Triton kernel this process precompiles inside the block."""
    noted = Noted()
    autotuner = resolve("CachingAutotuner")
    real = autotuner.precompile

    @functools.wraps(real)
    def precompile(self: Any, *args: Any, **kwargs: Any) -> Any:
        noted.kernels.append(self)
        return real(self, *args, **kwargs)

    autotuner.precompile = precompile
    try:
        yield noted
    finally:
        autotuner.precompile = real


TOOLCHAIN_FIELD = "autotune"
"""Where a manifest carries the records: its `toolchain`, which clients that predate them
keep (and verify) unread."""


def in_toolchain(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest `toolchain` entry for these records: none for none."""
    return {TOOLCHAIN_FIELD: records} if records else {}


def from_toolchain(toolchain: dict[str, Any]) -> list[dict[str, Any]]:
    """A manifest's records, checked; BadRecord if malformed."""
    return check_records(toolchain.get(TOOLCHAIN_FIELD, []))


def check_records(records: Any) -> list[dict[str, Any]]:
    """The records, if each is {"kernel": a kernel path, "best": a record}; BadRecord if not."""
    if not isinstance(records, list) or len(records) > MAX_RECORDS:
        raise BadRecord(f"autotune records are not a list of at most {MAX_RECORDS}")
    checked = []
    for record in records:
        if not isinstance(record, dict) or set(record) != {"kernel", "best"}:
            raise BadRecord("an autotune record is not {kernel, best}")
        path = record["kernel"]
        if not isinstance(path, str) or not KERNEL_PATH.fullmatch(path):
            raise BadRecord(f"autotune record for {str(path)[:80]!r}: not a kernel path")
        checked.append({"kernel": path, "best": _checked_best(record["best"])})
    return checked


def _checked_best(best: Any) -> dict[str, Any]:
    if not isinstance(best, dict) or not 0 < len(best) <= MAX_FIELDS:
        raise BadRecord(f"a best config is not an object of 1 to {MAX_FIELDS} fields")
    if not isinstance(best.get("configs_hash"), str):
        raise BadRecord("a best config names no configs_hash")
    for name, value in best.items():
        if not isinstance(name, str) or len(name) > 64:
            raise BadRecord("a best config's field name is not a short string")
        plain = value is None or isinstance(value, (bool, int, str)) or (
            isinstance(value, float) and math.isfinite(value)
        )
        if not plain or (isinstance(value, str) and len(value) > 256):
            raise BadRecord(f"best config field {name!r} is not a plain value")
    return dict(best)


def install(records: list[dict[str, Any]]) -> int:
    """Writes each checked record into this process's local autotune cache, under the key
    this Inductor will look it up by for the kernel at that path of its cache dir.
    Returns how many were written."""
    create = resolve("AutotuneCache").create
    root = resolve("inductor_cache_dir")()
    written = 0
    for record in records:
        best = record["best"]
        cache = create({"autotune_local_cache": True}, os.path.join(root, record["kernel"]), best["configs_hash"])
        if cache is None or cache.local_cache is None:
            continue  # the local autotune cache is off here
        local, key = cache.local_cache
        local.put(key, best)  # checked records are copies already (_checked_best)
        written += 1
    return written
