"""The node's shared blob cache: one fetch per blob for many processes, damaged files
fetched again, a size bound kept by evicting the least recently used."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from sdk import blobcache
from sdk.blobcache import BlobCache, digest_of


def test_a_blob_is_fetched_once_then_read_from_disk(tmp_path):
    cache = BlobCache(tmp_path, 1 << 20)
    data = b"payload" * 100
    calls = []

    def fetch():
        calls.append(1)
        return data

    assert cache.get(digest_of(data), fetch) == data
    assert cache.get(digest_of(data), fetch) == data
    assert calls == [1]


def test_a_damaged_file_is_fetched_again_not_returned(tmp_path):
    cache = BlobCache(tmp_path, 1 << 20)
    data = b"good bytes"
    d = digest_of(data)
    cache.get(d, lambda: data)
    (tmp_path / d.split(":")[1]).write_bytes(b"evil bytes")
    assert cache.get(d, lambda: data) == data


def test_bytes_that_do_not_match_the_digest_are_refused_and_not_kept(tmp_path):
    cache = BlobCache(tmp_path, 1 << 20)
    d = digest_of(b"expected")
    with pytest.raises(ValueError):
        cache.get(d, lambda: b"something else")
    assert cache.entries() == []


def test_a_digest_that_is_not_one_never_becomes_a_path(tmp_path):
    with pytest.raises(ValueError):
        BlobCache(tmp_path, 1 << 20).get("sha256:../../etc/passwd", lambda: b"")


def test_the_least_recently_used_blobs_go_past_the_bound(tmp_path):
    cache = BlobCache(tmp_path, 250)
    blobs = [bytes([i]) * 100 for i in range(3)]
    for i, b in enumerate(blobs[:2]):
        cache.get(digest_of(b), lambda b=b: b)
        os.utime(tmp_path / digest_of(b).split(":")[1], (1000 + i, 1000 + i))
    cache.get(digest_of(blobs[0]), lambda: pytest.fail("cached"))  # blob 0 used again
    cache.get(digest_of(blobs[2]), lambda: blobs[2])  # 300 bytes: one must go
    left = {p.name for p, _, _ in cache.entries()}
    assert left == {digest_of(blobs[0]).split(":")[1], digest_of(blobs[2]).split(":")[1]}


def _locks_held_while(cache: BlobCache, monkeypatch) -> list[bool]:
    """Whether the blob's lock was held at each read of a blob file under the cache."""
    held, seen = [False], []
    real_flock, real_read_bytes = fcntl.flock, Path.read_bytes

    def flock(fd, op):
        real_flock(fd, op)
        if not op & fcntl.LOCK_NB:
            held[0] = op != fcntl.LOCK_UN

    def read_bytes(path):
        if path.parent == cache.root:
            seen.append(held[0])
        return real_read_bytes(path)

    monkeypatch.setattr(blobcache.fcntl, "flock", flock)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    return seen


def test_a_cached_blob_is_read_without_its_lock(tmp_path, monkeypatch):
    """Ranks that read a cached blob holding its lock read it one after another."""
    cache = BlobCache(tmp_path, 1 << 20)
    data = b"payload" * 100
    cache.get(digest_of(data), lambda: data)
    seen = _locks_held_while(cache, monkeypatch)
    assert cache.get(digest_of(data), lambda: pytest.fail("cached")) == data
    assert seen == [False]


def test_a_rank_that_waited_on_a_download_reads_the_file_after_the_lock(tmp_path, monkeypatch):
    cache = BlobCache(tmp_path, 1 << 20)
    data = b"payload" * 100
    seen = _locks_held_while(cache, monkeypatch)
    path = tmp_path / digest_of(data).split(":")[1]
    real_flock = blobcache.fcntl.flock

    def flock(fd, op):  # another rank's download lands while this one waits on the lock
        if op == fcntl.LOCK_EX and not path.exists():
            path.write_bytes(data)
        real_flock(fd, op)

    monkeypatch.setattr(blobcache.fcntl, "flock", flock)
    hashed = []
    monkeypatch.setattr(blobcache, "digest_of", lambda b: hashed.append(b) or digest_of(b))
    assert cache.get(digest_of(data), lambda: pytest.fail("written by the other rank")) == data
    assert seen == [False, False]
    # The writer checked it a moment ago; sdk/artifact.py checks it again before loading.
    assert hashed == []


def _rank(root: str, data: bytes, counter: str) -> None:
    def fetch():
        with open(counter, "a") as f:
            f.write("x")
        time.sleep(0.2)  # a slow download: the other ranks must wait, not fetch
        return data

    assert BlobCache(root, 1 << 30).get(digest_of(data), fetch) == data


def test_processes_of_one_machine_fetch_each_blob_once(tmp_path):
    data = os.urandom(1 << 16)
    counter = tmp_path / "fetches"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(str(tmp_path / "c"), data, str(counter))) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert counter.read_text() == "x"


# A cache directory another local user can write (TORCHFARM_BLOB_CACHE_DIR on a shared
# disk): names they plant must never make this user write through a link.


def test_links_planted_at_the_temporary_and_lock_names_are_not_followed(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    victim, created = tmp_path / "bashrc", tmp_path / "created"
    victim.write_text("# the user's own file\n")
    blob = b'echo "runs at the next login"\n'
    hexpart = digest_of(blob).partition(":")[2]
    (root / f"{hexpart}.{os.getpid()}.tmp").symlink_to(victim)
    (root / f"{hexpart}.lock").symlink_to(created)
    cache = BlobCache(root, 1 << 30)
    with pytest.raises(OSError):  # the lock's link is refused, not followed
        cache.get(digest_of(blob), lambda: blob)
    assert victim.read_text() == "# the user's own file\n"
    assert not created.exists()
    (root / f"{hexpart}.lock").unlink()
    assert cache.get(digest_of(blob), lambda: blob) == blob
    assert victim.read_text() == "# the user's own file\n"
    assert not (root / hexpart).is_symlink()


def test_a_link_at_a_blobs_name_is_fetched_again_not_read(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"the user's private key")
    blob = b"blob"
    (root / digest_of(blob).partition(":")[2]).symlink_to(secret)
    calls = []
    assert BlobCache(root, 1 << 30).get(digest_of(blob), lambda: calls.append(1) or blob) == blob
    assert calls == [1] and secret.read_bytes() == b"the user's private key"


def test_the_cache_directory_is_made_private(tmp_path):
    root = tmp_path / "new" / "blobs"
    BlobCache(root, 1 << 30)
    assert root.stat().st_mode & 0o077 == 0
