"""Where artifact blobs live: a content-addressed store behind one small interface.

A blob is named by its digest (`sha256:<hex>`) and written once; every writer of a
digest writes the same bytes, so "put if absent" needs no lock, and a race between
two writers is harmless. Manifests, job records and the other small records stay in
the cache Redis (torchfarm/storage/store.py); only the bytes move here.

Two implementations, picked by one URL (`blob_url`, TORCHFARM_BLOB_URL):

- "" (the default): the cache Redis itself, keys `<prefix>:blob:<digest>`, as the
  embedded stack has always kept them. A blob above `part_bytes` (Redis refuses values
  over 512 MB) is kept in parts `<prefix>:blob:<digest>:<i>` under an index
  `<prefix>:blobparts:<digest>` written after the parts, so an index names whole parts.
- `redis://...`: the same on another Redis.
- `s3://bucket/prefix?endpoint=http://host:9000&region=us-east-1`: S3-compatible
  object storage (AWS S3, MinIO, moto) through boto3, one object per blob,
  `<prefix>/blobs/<hex>`, uploaded in multipart parts above `part_bytes`; credentials
  come from boto3's usual chain (AWS_ACCESS_KEY_ID, ~/.aws, an instance role).
  This store can pre-sign short-lived GET URLs, so clients may download directly.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import parse_qs, urlsplit

import redis

log = logging.getLogger(__name__)

DEFAULT_PART_BYTES = 256 * 1024 * 1024
"""Blobs above this go in parts: under Redis's 512 MB value limit, and a sane S3 part."""


class BlobStoreError(ValueError):
    """A blob store URL that names no store this farm can use."""


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    size: int
    """Bytes; on Redis, for a blob in one value, the memory it takes (a little more)."""
    age_s: float
    """Seconds since the blob was written (or, on Redis, since it was last read or written)."""


class BlobStore(Protocol):
    """The operations the farm needs from wherever blobs live. Safe to share between threads."""

    def put(self, digest: str, data: bytes) -> None:
        """Stores `data` under `digest` unless a blob of that digest is already there."""

    def get(self, digest: str) -> bytes | None: ...

    def get_range(self, digest: str, start: int, end: int) -> bytes:
        """Bytes [start, end] inclusive (fewer, or none, if the blob is shorter or gone)."""

    def present(self, digests: Iterable[str]) -> list[bool]:
        """For each digest, in order, whether its blob is there."""

    def delete(self, digest: str) -> None: ...

    def list(self) -> Iterator[BlobInfo]:
        """Every blob, with its size and age, in no particular order."""

    def presign(self, digest: str, ttl_s: int) -> str | None:
        """A URL that GETs the blob's bytes for `ttl_s` seconds, or None where the store
        cannot hand out direct links (Redis)."""


def _hex(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or not all(c in "0123456789abcdef" for c in hexpart):
        raise ValueError(f"not a blob digest: {digest[:80]!r}")
    return hexpart


class RedisBlobs:
    """Blobs in Redis, large ones in parts."""

    def __init__(self, client: redis.Redis, prefix: str = "tf", part_bytes: int = DEFAULT_PART_BYTES):
        self.r = client
        self.prefix = prefix
        self.part_bytes = part_bytes

    def _key(self, digest: str) -> str:
        return f"{self.prefix}:blob:{digest}"

    def _index(self, digest: str) -> str:
        return f"{self.prefix}:blobparts:{digest}"

    def _parts(self, digest: str) -> dict[str, int] | None:
        raw = self.r.get(self._index(digest))
        return cast("dict[str, int]", json.loads(raw)) if raw is not None else None

    def put(self, digest: str, data: bytes) -> None:
        if len(data) <= self.part_bytes:
            self.r.set(self._key(digest), data, nx=True)
            return
        if self.r.exists(self._index(digest)):
            return
        step = self.part_bytes
        for i, offset in enumerate(range(0, len(data), step)):
            self.r.set(f"{self._key(digest)}:{i}", data[offset : offset + step])
        # The index last: a reader that sees it finds every part.
        self.r.set(self._index(digest), json.dumps({"size": len(data), "part": step}), nx=True)

    def get(self, digest: str) -> bytes | None:
        data = cast("bytes | None", self.r.get(self._key(digest)))  # a client that never decodes
        if data is not None:
            return data
        parts = self._parts(digest)
        if parts is None:
            return None
        data = self.get_range(digest, 0, parts["size"] - 1)
        return data if len(data) == parts["size"] else None

    def get_range(self, digest: str, start: int, end: int) -> bytes:
        parts = self._parts(digest)
        if parts is None:
            return cast(bytes, self.r.getrange(self._key(digest), start, end))
        end = min(end, parts["size"] - 1)
        step, out = parts["part"], list[bytes]()
        while start <= end:
            i, within = divmod(start, step)
            take = min(end - start, step - 1 - within)
            piece = cast(bytes, self.r.getrange(f"{self._key(digest)}:{i}", within, within + take))
            if not piece:
                break  # a part was evicted: the caller sees a short read
            out.append(piece)
            start += len(piece)
        return b"".join(out)

    def present(self, digests: Iterable[str]) -> list[bool]:
        digests = list(digests)
        pipe = self.r.pipeline(transaction=False)
        for d in digests:
            pipe.exists(self._key(d), self._index(d))
        return [bool(n) for n in pipe.execute()]

    def delete(self, digest: str) -> None:
        parts = self._parts(digest)
        keys = [self._key(digest), self._index(digest)]
        if parts is not None:
            count = -(-parts["size"] // parts["part"])
            keys += [f"{self._key(digest)}:{i}" for i in range(count)]
        self.r.delete(*keys)

    def list(self) -> Iterator[BlobInfo]:
        single = f"{self.prefix}:blob:"
        for name in self.r.scan_iter(match=single + "sha256:*", count=1000):
            digest = name.decode()[len(single) :]
            if digest.count(":") == 1:  # not a part `<digest>:<i>`
                # MEMORY USAGE, unlike STRLEN, does not count as a use: listing leaves
                # ages alone. It is the value's allocation, a little above its length.
                idle = self._idle(name)
                yield BlobInfo(digest, int(self.r.memory_usage(name, samples=0) or 0), idle)
        index = f"{self.prefix}:blobparts:"
        for name in self.r.scan_iter(match=index + "*", count=1000):
            digest = name.decode()[len(index) :]
            idle = self._idle(f"{self._key(digest)}:0".encode())  # reads touch the parts
            parts = json.loads(self.r.get(name) or b'{"size": 0}')
            yield BlobInfo(digest, int(parts["size"]), idle)

    def _idle(self, key: bytes) -> float:
        # Redis keeps no write time; OBJECT IDLETIME (seconds since last access) is the
        # age the collector can go by without a write-time record per blob.
        return float(self.r.object("idletime", key) or 0)

    def presign(self, digest: str, ttl_s: int) -> str | None:
        return None


class S3Blobs:
    """Blobs as objects in an S3-compatible bucket, through boto3."""

    def __init__(self, client: Any, bucket: str, prefix: str = "", part_bytes: int = DEFAULT_PART_BYTES):
        from boto3.s3.transfer import TransferConfig

        self.s3 = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.transfer = TransferConfig(multipart_threshold=part_bytes, multipart_chunksize=part_bytes)

    def _key(self, digest: str) -> str:
        return f"{self.prefix}/blobs/{_hex(digest)}" if self.prefix else f"blobs/{_hex(digest)}"

    def _missing(self, e: Exception) -> bool:
        code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
        return code in ("404", "NoSuchKey", "NotFound", "InvalidRange", "416")

    def _has(self, digest: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.s3.head_object(Bucket=self.bucket, Key=self._key(digest))
            return True
        except ClientError as e:
            if self._missing(e):
                return False
            raise

    def put(self, digest: str, data: bytes) -> None:
        if self._has(digest):
            return
        self.s3.upload_fileobj(io.BytesIO(data), self.bucket, self._key(digest), Config=self.transfer)

    def get(self, digest: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            return cast(bytes, self.s3.get_object(Bucket=self.bucket, Key=self._key(digest))["Body"].read())
        except ClientError as e:
            if self._missing(e):
                return None
            raise

    def get_range(self, digest: str, start: int, end: int) -> bytes:
        from botocore.exceptions import ClientError

        try:
            reply = self.s3.get_object(
                Bucket=self.bucket, Key=self._key(digest), Range=f"bytes={start}-{end}"
            )
            return cast(bytes, reply["Body"].read())
        except ClientError as e:
            if self._missing(e):
                return b""
            raise

    def present(self, digests: Iterable[str]) -> list[bool]:
        return [self._has(d) for d in digests]

    def delete(self, digest: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=self._key(digest))

    def list(self) -> Iterator[BlobInfo]:
        pre = f"{self.prefix}/blobs/" if self.prefix else "blobs/"
        now = time.time()
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=pre)
        for page in pages:
            for obj in page.get("Contents", []):
                age = now - obj["LastModified"].timestamp()
                yield BlobInfo("sha256:" + obj["Key"][len(pre) :], int(obj["Size"]), max(age, 0.0))

    def presign(self, digest: str, ttl_s: int) -> str | None:
        return cast(str, self.s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self._key(digest)}, ExpiresIn=ttl_s
        ))


def s3_client(endpoint: str = "", region: str = "") -> Any:
    import boto3
    from botocore.config import Config

    # Path-style addressing: MinIO and moto serve it; AWS S3 serves it too.
    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5, "mode": "standard"},
                    max_pool_connections=32)
    return boto3.client(
        "s3", endpoint_url=endpoint or None, region_name=region or "us-east-1", config=config
    )


def open_blobs(url: str, cache: redis.Redis, prefix: str = "tf",
               part_bytes: int = DEFAULT_PART_BYTES) -> BlobStore:
    """The blob store `url` names; "" is the cache Redis `cache` itself."""
    if not url:
        return RedisBlobs(cache, prefix, part_bytes)
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss", "unix", "redis+sentinel"):
        from torchfarm.storage.redisconn import connect

        client = connect(url, socket_timeout=30, socket_connect_timeout=5)
        return RedisBlobs(client, prefix, part_bytes)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise BlobStoreError(f"blob URL {url!r} names no bucket (s3://bucket/prefix)")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint", "region"}
        if unknown:
            raise BlobStoreError(f"blob URL {url!r}: unknown option(s) {sorted(unknown)}")
        client = s3_client(query.get("endpoint", ""), query.get("region", ""))
        return S3Blobs(client, parts.netloc, parts.path, part_bytes)
    raise BlobStoreError(f"blob URL {url!r}: the scheme must be s3:// or redis://")
