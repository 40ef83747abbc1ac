"""Files written whole or not at all, and who else may write them.

Every file the project writes where another process may read it (a kernel library
Inductor dlopens, a blob the node's ranks share, a package, the tokens a coordinator
reloads, a trust file, the toolchain record) goes through `write_atomic`. What the SDK
reads or loads from a directory it did not make passes `others_may_write` first
(`foreign`, with its owner).
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> None:
    """Writes `data` at `path`: into a new file beside it (mkstemp's, so never a planted
    link, and mode 0600 unless `mode`), then renamed over `path`. A reader sees the old
    file or the whole new one, never half of it; a library already loaded from `path`
    keeps its old inode. A failure leaves no temporary file behind."""
    directory = os.path.dirname(os.fspath(path)) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".torchfarm-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def others_may_write(st: os.stat_result, private_group: bool = False) -> bool:
    """Whether anyone but the owner may write the file or directory `st` describes: the
    world, or a group. With `private_group`, a group that is this user's own private one
    does not count (umask 002 on distributions that make one per user, so that
    `/tmp/torchinductor_<user>` is 0775 there)."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o002:
        return True
    if not mode & 0o020:
        return False
    if not private_group:
        return True
    try:
        return st.st_gid != os.getgid() or bool(grp.getgrgid(st.st_gid).gr_mem)
    except KeyError:
        return True


def foreign(st: os.stat_result, *, root_ok: bool = False, private_group: bool = False) -> bool:
    """Whether someone other than this user may have written the file or directory `st`
    describes: another owner (root is not one, with `root_ok`: a mounted secret, an
    installed tree), or anyone `others_may_write` names."""
    owners = (os.getuid(), 0) if root_ok else (os.getuid(),)
    return st.st_uid not in owners or others_may_write(st, private_group)


def on_the_way(path: Path) -> list[Path]:
    """`path`, each symbolic link it leads through to a file, that file, and the directory
    each of them is in: whoever may replace any of them chooses the file read."""
    found = [path, path.parent]
    while path.is_symlink():
        if len(found) > 2 * 40:  # the kernel's limit: it would not open the file either
            raise OSError(errno.ELOOP, "too many levels of symbolic links", str(found[0]))
        path = path.parent / os.readlink(path)
        found += [path, path.parent]
    return found


def replaceable_above(paths: Iterable[Path]) -> str | None:
    """Why the first directory above `paths` (`on_the_way`'s, links followed and not) in
    which someone other than this user or root may rename entries is one; None when
    there is none. Whoever may do that puts a tree of their own in place of all below
    it, between a check of the file and its read. A sticky directory of this user's or
    root's (/tmp) lets others add entries, not move ours."""
    seen: set[Path] = set()
    for path in paths:
        for above in (*Path(os.path.abspath(path)).parents, *Path(os.path.realpath(path)).parents):
            if above in seen:
                continue
            seen.add(above)
            st = above.stat()
            sticky = st.st_mode & stat.S_ISVTX
            if st.st_uid not in (os.getuid(), 0) or (others_may_write(st, private_group=True) and not sticky):
                return (
                    f"{above} is writable by others or owned by another user (uid {st.st_uid}, mode "
                    f"{stat.S_IMODE(st.st_mode):o}): whoever may rename what is in it can put files of "
                    "their own in place of those below it"
                )
    return None
