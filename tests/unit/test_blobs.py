"""The blob store contract, run against both implementations: a real redis-server and
moto's S3 server (tests/conftest.py), with small parts so that large-blob code runs."""

from __future__ import annotations

import hashlib
import os
import urllib.request

import pytest
import redis

from torchfarm.storage.blobs import BlobStoreError, RedisBlobs, open_blobs

S3_MIN_PART = 5 * 1024 * 1024
"""S3 (and moto) refuse multipart parts below 5 MiB, except the last."""


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["redis", "s3"])
def blobs(request, redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    if request.param == "redis":
        yield RedisBlobs(client, "tf", part_bytes=1024)
    else:
        url = request.getfixturevalue("s3_blob_url")
        store = open_blobs(url.replace("/farm?", f"/unit-{os.getpid()}?"), client, part_bytes=S3_MIN_PART)
        yield store
        for info in list(store.list()):
            store.delete(info.digest)
    client.flushall()


def test_put_if_absent_get_has_delete(blobs):
    data = b"kernel bytes" * 10
    d = digest_of(data)
    assert blobs.present([d]) == [False]
    assert blobs.get(d) is None
    blobs.put(d, data)
    blobs.put(d, data)  # a second writer of the same digest changes nothing
    assert blobs.get(d) == data
    assert blobs.present([d, digest_of(b"other")]) == [True, False]
    blobs.delete(d)
    assert blobs.present([d]) == [False]
    assert blobs.get(d) is None


def test_ranges_and_the_list_of_blobs_with_sizes_and_ages(blobs):
    data = bytes(range(256)) * 4
    d = digest_of(data)
    blobs.put(d, data)
    assert blobs.get_range(d, 10, 19) == data[10:20]
    assert blobs.get_range(d, 1000, 5000) == data[1000:]  # past the end: what there is
    assert blobs.get_range(digest_of(b"gone"), 0, 9) == b""
    (info,) = list(blobs.list())
    assert info.digest == d
    assert len(data) <= info.size <= len(data) + 512  # Redis: the value's allocation
    assert info.age_s >= 0


def test_a_blob_larger_than_a_part_goes_in_parts_and_reads_back_whole(blobs):
    part = getattr(blobs, "part_bytes", S3_MIN_PART)
    data = os.urandom(2 * part + 12345)
    d = digest_of(data)
    blobs.put(d, data)
    assert blobs.get(d) == data
    # A range across the boundary between two parts.
    assert blobs.get_range(d, part - 5, part + 4) == data[part - 5 : part + 5]
    assert [(i.digest, i.size) for i in blobs.list()] == [(d, len(data))]
    blobs.delete(d)
    assert blobs.present([d]) == [False]
    assert list(blobs.list()) == []


def test_redis_parts_leave_no_value_above_the_part_size(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    store = RedisBlobs(client, "tf", part_bytes=100)
    data = os.urandom(1050)
    store.put(digest_of(data), data)
    sizes = [client.strlen(k) for k in client.scan_iter(match="tf:blob:*")]
    assert len(sizes) == 11 and max(sizes) == 100
    client.flushall()


def test_only_s3_hands_out_direct_links_and_they_serve_the_bytes(blobs):
    data = b"direct" * 100
    d = digest_of(data)
    blobs.put(d, data)
    url = blobs.presign(d, 60)
    if isinstance(blobs, RedisBlobs):
        assert url is None
        return
    assert urllib.request.urlopen(url, timeout=10).read() == data


@pytest.mark.parametrize("url", ["s3://", "ftp://host/x", "s3://bucket/p?endpont=http://x"])
def test_a_blob_url_that_names_no_usable_store_is_a_clear_error(url):
    with pytest.raises(BlobStoreError):
        open_blobs(url, None)


def test_a_digest_that_is_not_one_never_becomes_an_object_key(s3_blob_url, redis_url):
    store = open_blobs(s3_blob_url, redis.Redis.from_url(redis_url))
    with pytest.raises(ValueError):
        store.put("sha256:../../other-prefix/x", b"x")
