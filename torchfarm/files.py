"""Files written whole or not at all.

Every file the project writes where another process may read it (a kernel library
Inductor dlopens, a blob the node's ranks share, a package, the tokens a coordinator
reloads, a trust file, the toolchain record) goes through `write_atomic`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile


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
