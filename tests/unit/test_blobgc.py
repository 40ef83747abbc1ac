"""Lifecycle: blobs no record names are collected after the grace period, and only those."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from tests.requests import kernel_manifest
from torchfarm.storage.blobgc import collect


def put(store, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    store.put_blob(digest, data)
    return digest


@pytest.fixture(params=["redis", "s3"])
def gc_store(request, store):
    if request.param == "s3":
        from torchfarm.storage.blobs import open_blobs

        url = request.getfixturevalue("s3_blob_url").replace("/farm?", "/gc?")
        store.blobs = open_blobs(url, store.r)
    yield store
    for info in list(store.blobs.list()):
        store.blobs.delete(info.digest)


def test_only_unreferenced_blobs_past_the_grace_period_go(gc_store):
    store = gc_store
    named = put(store, b"payload named by a manifest")
    kernel = put(store, b"binary named by a kernel record")
    orphan = put(store, b"orphan")
    store.r.set("tf:artifact:alice:k1", json.dumps({"payload": {"digest": named, "size": 1}}))
    store.put_kernel(kernel_manifest("kk", b"binary named by a kernel record"))
    assert collect(store, grace_s=3600) == []  # all young: nothing goes
    would = collect(store, grace_s=0, dry_run=True)
    assert [b.digest for b in would] == [orphan]
    assert store.blobs.present([orphan]) == [True]  # a dry run deletes nothing
    gone = collect(store, grace_s=0)
    assert [b.digest for b in gone] == [orphan]
    assert store.blobs.present([named, kernel, orphan]) == [True, True, False]


def age(store, digest: str, seconds: int) -> None:
    """Makes a Redis blob look unused for `seconds` (RESTORE ... IDLETIME)."""
    key = f"tf:blob:{digest}"
    store.r.restore(key, 0, store.r.dump(key), replace=True, idletime=seconds)


def test_the_bounds_take_the_oldest_blobs_named_or_not(store):
    old = put(store, b"o" * 1000)
    new = put(store, b"n" * 1000)
    store.r.set("tf:artifact:k", json.dumps({"a": old, "b": new}))
    age(store, old, 1000)
    assert collect(store, grace_s=0, max_bytes=10_000, max_age_s=5000) == []  # within both
    assert [b.digest for b in collect(store, grace_s=0, max_bytes=1600, dry_run=True)] == [old]
    assert [b.digest for b in collect(store, grace_s=0, max_age_s=500)] == [old]
    assert store.blobs.present([old, new]) == [False, True]


def test_cache_gc_dry_run_on_the_command_line(store, redis_url):
    orphan = put(store, b"orphan for the cli")
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "cache", "gc", "--dry-run", "--grace", "0s",
         "--cache-url", redis_url, "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["dry_run"], report["blobs"]) == (True, [orphan])
    assert report["bytes"] >= len(b"orphan for the cli")
    assert store.blobs.present([orphan]) == [True]


def test_a_blob_named_only_by_what_a_client_sent_is_collected(store):
    """Labels, requests and miss records hold a client's text, never a blob the farm
    stores: a client that names a digest there keeps nothing from the collector."""
    orphan = put(store, b"unreferenced, then named in a label")
    store.create_job("k1", "cpu", f"my run {orphan}", ttl_s=600, request=orphan.encode())
    store.c.set("tf:why:alice:k1", json.dumps({"detail": orphan}))
    # A precompiled record's parts, and the index of a namespace's kept misses.
    store.c.set("tf:explainparts:alice:pc1-" + "a" * 64, json.dumps({"graphs": [orphan]}))
    store.c.zadd("tf:whyidx:alice", {orphan: 1.0})
    assert [b.digest for b in collect(store, grace_s=0)] == [orphan]


def test_a_blob_named_only_in_a_packages_free_text_is_collected(store):
    """A precompiled package's manifest is a client's upload: a digest in its fingerprint
    or worker field names no blob of it, and keeps nothing from the collector; the blobs
    it does name stay."""
    import time

    from services.coordinator.precompiled import store_upload
    from torchfarm.wire.manifest import PRECOMPILED, BlobRef, Manifest

    orphan = put(store, b"an evicted artifact's blob")
    own = b"the package's own payload"
    digest = "sha256:" + hashlib.sha256(own).hexdigest()
    package = Manifest(key="pc1-" + "a" * 64, fingerprint={"torch": "x", "pin": orphan}, worker=orphan,
                       payload=BlobRef(digest, len(own)), created=time.time(), tenant="alice",
                       kind=PRECOMPILED, graphs={"__compiled_fn_1": "b" * 64})
    store_upload(store.tenant("alice"), package, {digest: own}, ttl_s=0)
    assert [b.digest for b in collect(store, grace_s=0)] == [orphan]
