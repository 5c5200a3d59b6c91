"""A file the kubelet projects from one of the worker pod's annotations (a downward API volume), read
by rank 0 between steps: the operator's way to tell running trainers something (the global batch,
the memory budget) without restarting them.

The kubelet refreshes a projected annotation only on its periodic sync (about a minute), so reading
more often than ``READ_INTERVAL_SECONDS`` finds nothing new: however short the steps, a file costs at
most one small read a second. A missing or unreadable file reads as empty (nothing asked); a read
error is logged once per distinct error, to the caller's logger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

READ_INTERVAL_SECONDS = 1.0


class ProjectedFile:
    """Throttled reads of one projected file, reporting its content only when it changed."""

    def __init__(
        self, path: str, log: logging.Logger, what: str, clock: Callable[[], float] = time.monotonic
    ):
        """``what`` names the value in read-error log lines ("the global batch size")."""
        self.path = Path(path)
        self.log = log
        self.what = what
        self.clock = clock
        self._read_at: float | None = None
        self._text: str | None = None  # the content last read
        self._error = ""  # the last read error logged

    def changed(self) -> str | None:
        """The file's content when the interval has passed and it differs from the last read
        (the first read always counts as a change); None otherwise."""
        now = self.clock()
        if self._read_at is not None and now - self._read_at < READ_INTERVAL_SECONDS:
            return None
        self._read_at = now
        text = self._read()
        if text == self._text:
            return None
        self._text = text
        return text

    def _read(self) -> str:
        try:
            return self.path.read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return ""
        except OSError as error:
            if str(error) != self._error:
                self._error = str(error)
                self.log.warning("cannot read %s from %s: %s", self.what, self.path, error)
            return ""
