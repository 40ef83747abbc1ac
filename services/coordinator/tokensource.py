"""The coordinator's token table, reloaded when its file changes.

Revoking a token is removing its line from `TORCHFARM_TOKENS_FILE` (and a new token is
adding one): the next call after the change sees it, with no restart. The file is
stat()ed at most once every `check_every_s`, and read again only when its inode, size or
modification time changed, so the check costs a system call a second, not a read per
call. Write the file whole and rename it into place (`torchfarm token --tokens-file`
does); an editor that rewrites in place works too, but a reader may see it half written.

A file that is gone or does not parse admits no one until it is put right, and the log
says so: a farm started with tokens never opens up because its table broke.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from torchfarm.trust.tokens import TokenError, TokenTable

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
"""How often the tokens file is looked at for a change: the longest a revoked token
still works."""

_NOBODY = TokenTable({})


class TokenSource:
    def __init__(
        self, path: str, check_every_s: float = CHECK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.path = path
        self.check_every_s = check_every_s
        self.clock = clock
        self._seen: tuple[int, int, int, int] | None = None
        self._table = _NOBODY
        self._checked = float("-inf")
        self._reload()

    def table(self) -> TokenTable:
        """The table as the file holds it now (at most check_every_s old)."""
        now = self.clock()
        if now - self._checked >= self.check_every_s:
            self._checked = now
            self._reload()
        return self._table

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError as e:
            if self._seen != (0, 0, 0, 0):
                log.error("tokens file %s is gone (%s): refusing every call until it is back", self.path, e)
            self._seen, self._table = (0, 0, 0, 0), _NOBODY
            return
        seen = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            self._table = TokenTable.from_file(self.path)
        except (OSError, TokenError) as e:
            log.error("tokens file %s does not parse (%s): refusing every call until fixed", self.path, e)
            self._table = _NOBODY
            return
        log.info("authentication on: %d tokens from %s", len(self._table), self.path)
