"""One tenant's uploads never evict another's entries (issue 40, item 3), on the wire:
a real gRPC coordinator, a state redis-server (`noeviction`) and a cache redis-server
capped at 64 MiB with `allkeys-lru`, as a deployment runs them; Celery replaced by a
recorder. Before the fix, 12 uploads of 8 MiB by one tenant were all accepted in about
a second, and Redis's LRU evicted the other tenant's artifact and its miss explanation."""

from __future__ import annotations

import time

import grpc
import pytest

from localfarm.fakes import InlineDispatcher
from localfarm.stack import free_port, redis_command, wait_for_redis
from services.coordinator.settings import CoordinatorSettings
from tests.coordinator_server import running_coordinator
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.storage.explain import MissIndex
from torchfarm.storage.store import Store
from torchfarm.trust import tokens
from torchfarm.v1 import farm_pb2, farm_pb2_grpc
from torchfarm.wire.manifest import COMPILE, PRECOMPILED, BlobRef, KernelRef, Manifest, blob_digest

pytestmark = pytest.mark.integration

MIB = 1 << 20


@pytest.fixture
def split_redis(tmp_path):
    """(state URL, cache URL): two redis-servers, the cache capped and evicting."""
    import subprocess

    procs, urls = [], []
    for name, extra in (
        ("state", ("--maxmemory-policy", "noeviction")),
        ("cache", ("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")),
    ):
        port = free_port()
        (tmp_path / name).mkdir()
        procs.append(subprocess.Popen(redis_command(port, tmp_path / name, *extra),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"redis://127.0.0.1:{port}/0")
        wait_for_redis(urls[-1])
    yield urls[0], urls[1]
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def _call(address: str, token: str):
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 * MIB)])
    return channel, farm_pb2_grpc.CompileFarmStub(channel), (("authorization", f"Bearer {token}"),)


def _package(n: int) -> farm_pb2.PrecompiledUpload:
    payload = n.to_bytes(4, "big") * (2 * MIB)  # 8 MiB
    manifest = Manifest(key="pc1-" + f"{n:064x}", fingerprint={"torch": "x"},
                        payload=BlobRef(blob_digest(payload), len(payload)), tenant="alice",
                        kind=PRECOMPILED, graphs={"__compiled_fn_1": "f" * 64})
    return farm_pb2.PrecompiledUpload(
        manifest=manifest.to_json(), blobs=[farm_pb2.PrecompiledBlob(digest=manifest.payload.digest, data=payload)]
    )


def test_one_tenants_uploads_do_not_evict_anothers_artifact_or_explanation(split_redis, tmp_path):
    state_url, cache_url = split_redis
    alice, bob = tokens.new_token("alice"), tokens.new_token("bob")
    path = tmp_path / "tokens.json"
    import json

    path.write_text(json.dumps({**tokens.table_entry(alice, "alice"), **tokens.table_entry(bob, "bob")}))
    port = free_port()
    settings = CoordinatorSettings(
        listen=f"127.0.0.1:{port}", cache_url=cache_url, state_url=state_url, tokens_file=str(path),
        poll_interval_s=0.02, grace_s=1,
    )
    store = Store.from_url(cache_url, state_url=state_url)
    store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=60)
    with running_coordinator(settings, InlineDispatcher()):
        address = f"127.0.0.1:{port}"
        # Bob compiles: a miss, explained; his worker stores an artifact of 8 blobs.
        channel, stub, md = _call(address, bob)
        with channel:
            key = stub.Submit(relu_request(), timeout=20, metadata=md).key
        bobs = store.tenant("bob")
        blobs = [b"bob%d" % i + b"\0" * MIB for i in range(8)]
        for data in blobs:
            bobs.put_blob(blob_digest(data), data)
        bobs.put_manifest(Manifest(
            key=key, fingerprint={}, payload=BlobRef(blob_digest(blobs[0]), len(blobs[0])), tenant="bob",
            kind=COMPILE, created=time.time(),
            kernels=tuple(
                KernelRef(f"k{i}", "cpp", BlobRef(blob_digest(d), len(d)), BlobRef(blob_digest(d), len(d)))
                for i, d in enumerate(blobs[1:])
            ),
        ))
        assert bobs.get_manifest(key) is not None and MissIndex(bobs).last(key) is not None

        # Alice uploads 12 packages of 8 MiB, 96 MiB into a 64 MiB cache.
        outcomes = []
        channel, stub, md = _call(address, alice)
        with channel:
            for n in range(12):
                try:
                    outcomes.append(stub.PutPrecompiled(_package(n), timeout=30, metadata=md).key and "ok")
                except grpc.RpcError as e:
                    outcomes.append(dict(e.trailing_metadata() or ()).get("torchfarm-reason", e.code().name))

        assert bobs.get_manifest(key) is not None, outcomes  # every blob still there
        assert MissIndex(bobs).last(key) is not None
        assert int(store.c.info("stats")["evicted_keys"]) == 0  # Redis never had to evict
        # Alice made room of her own packages: her latest is there, her first is not.
        assert outcomes[-1] == "ok", outcomes
        mine = store.tenant("alice")
        assert mine.get_manifest("pc1-" + f"{11:064x}") is not None
        assert mine.get_manifest("pc1-" + f"{0:064x}") is None
