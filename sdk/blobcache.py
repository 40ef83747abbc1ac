"""A read-through blob cache shared by the processes of one machine.

The ranks of a `torchrun` job start together and want the same artifact: with this
cache, the first to ask downloads each blob and the others wait on its lock, then read
the file. Blobs are files named by their digest's hex under one directory (default
`~/.cache/torchfarm/blobs`); `<hex>.lock` is the blob's lock (fcntl.flock, exclusive),
held only while the blob is fetched and written. A file is written to a temporary name
and renamed, so a blob file that exists is whole: reading one takes no lock, and the
ranks waiting on a download read it side by side once it lands (holding the lock to
read, they read one after another: 16 ranks took 16 reads' time). Its digest is checked
when it is written and on every later read, so a damaged file is fetched again rather
than loaded; the ranks that waited on its download read it unchecked (`_read`).

The total is bounded: after a write, the least recently used blobs (by mtime, which
every read refreshes) go until the directory is under `max_bytes`.

The directory is made private (0700). One that others can write (a shared disk) costs
at most a fetch: a planted blob fails its digest, and this cache writes only new files
(`mkstemp`) and opens locks without following links, so a planted link never has this
user write a file of someone else's choosing.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from torchfarm.files import write_atomic

log = logging.getLogger(__name__)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class BlobCache:
    def __init__(self, root: str | Path, max_bytes: int):
        self.root = Path(root).expanduser()
        self.max_bytes = max_bytes
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        algo, _, hexpart = digest.partition(":")
        if algo != "sha256" or len(hexpart) != 64 or not all(c in "0123456789abcdef" for c in hexpart):
            raise ValueError(f"not a blob digest: {digest[:80]!r}")
        return self.root / hexpart

    @contextmanager
    def _locked(self, path: Path, flags: int = fcntl.LOCK_EX) -> Iterator[None]:
        # O_NOFOLLOW: in a directory another user can write, a link planted at the lock's
        # name would have this user create or append to a file of theirs.
        fd = os.open(path.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a") as lock:
            fcntl.flock(lock, flags)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def get(self, digest: str, fetch: Callable[[], bytes]) -> bytes:
        """The blob's bytes, from this machine's cache or, once per machine, `fetch()`.
        `fetch` must return bytes of this digest; the caller's check of them runs first."""
        path = self._path(digest)
        fresh = False
        for _ in range(2):
            data = self._read(path, digest, check=not fresh)
            if data is not None:
                return data
            with self._locked(path):
                # Another process wrote it while this one waited: read it after the lock.
                fresh = path.exists()
                if not fresh:
                    data = self._store(path, digest, fetch)
            if data is not None:
                self.evict()
                return data
        # Written by another process, then gone or damaged again before this one read it.
        with self._locked(path):
            data = self._store(path, digest, fetch)
        self.evict()
        return data

    def _store(self, path: Path, digest: str, fetch: Callable[[], bytes]) -> bytes:
        """Fetches the blob and writes its file; the caller holds the blob's lock."""
        data = fetch()
        if digest_of(data) != digest:
            raise ValueError(f"fetched bytes do not match {digest[:19]}")
        write_atomic(path, data)  # through a new file, never a link
        return data

    def _read(self, path: Path, digest: str, check: bool = True) -> bytes | None:
        """The file's bytes; None if it is gone or (`check`) damaged. A file that another
        process checked and wrote while this one waited on its lock is read unchecked:
        damage is what the check is for, and the artifact's verification hashes every
        blob before anything loads it (sdk/artifact.py, step 5) whatever this cache did."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if check and digest_of(data) != digest:
            log.warning("torchfarm: cached blob %s is damaged; fetching it again", digest[:19])
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recently used: last to be evicted
        return data

    def entries(self) -> list[tuple[Path, int, float]]:
        """(path, size, mtime) of every cached blob."""
        out = []
        for p in self.root.iterdir():
            if len(p.name) == 64 and "." not in p.name:
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                out.append((p, st.st_size, st.st_mtime))
        return out

    def evict(self) -> int:
        """Removes least recently used blobs until the total is within the bound; returns
        how many went. A blob whose lock another process holds is skipped this time."""
        entries = sorted(self.entries(), key=lambda e: e[2])
        total = sum(size for _, size, _ in entries)
        removed = 0
        for path, size, _ in entries:
            if total <= self.max_bytes:
                break
            try:
                with self._locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB):
                    path.unlink(missing_ok=True)
            except BlockingIOError:
                continue
            # The lock file stays: another process may have it open, waiting on it.
            total -= size
            removed += 1
        return removed
