"""Records read back from Redis are storage, not trusted input: whatever bytes sit under a
key, the coordinator treats an unreadable record as missing and compiles again, never
fails every later request for that key."""

from __future__ import annotations

import asyncio

from localfarm.fakes import InlineDispatcher, memory_store
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.wire import keys
from torchfarm.wire.manifest import BlobRef, Manifest

NESTED = b'{"format": "torchfarm.artifact/1", "key": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
"""Past the interpreter's recursion limit for json's decoder, which recurses per level."""


def _farm():
    store = memory_store()
    store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    return store, Farm(CoordinatorSettings(poll_interval_s=0.01), store, InlineDispatcher())


def test_a_manifest_nested_past_the_parsers_depth_is_dropped_and_recompiled():
    store, farm = _farm()
    request = relu_request()
    key = keys.compute_key(request)
    store.c.set(store._j("artifact", key), NESTED)
    submitted = asyncio.run(farm.submit(request, request.ByteSize()))
    assert not submitted.cache_hit
    assert len(farm.dispatcher.sent) == 1, "the corrupt entry was not replaced by a compile"
    assert store.c.get(store._j("artifact", key)) is None


def test_an_unreadable_kernel_record_is_a_miss():
    store = memory_store()
    # The last two: a kernel record from before kernels had manifests, and an artifact's
    # manifest written where a kernel's belongs.
    old_record = b'{"binary": {"digest": "sha256:00", "size": 1}, "kind": "cubin"}'
    artifact = Manifest(key="k" * 64, fingerprint={}, payload=BlobRef("sha256:00", 1)).to_json()
    for data in (b"{not json", NESTED, b"[1]", b'{"binary": 3}', old_record, artifact):
        store.c.set(store._j("kernel", "k" * 64), data)
        assert store.get_kernel("k" * 64) is None, data[:20]
        assert store.c.get(store._j("kernel", "k" * 64)) is None, "the record stays to fail again"
