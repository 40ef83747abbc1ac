"""The CLI's own error: what a command reports in one line on stderr, with its exit status."""

from __future__ import annotations


class CliError(Exception):
    """An operational error a command reports as one line (no traceback) and exits with
    `status`: 1 for a failure, 2 for a usage error."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status
