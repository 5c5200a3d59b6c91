"""The node's journal: an optional JSON-lines record of what its launcher and workers did.

Each line is one event (``{"event": ..., "time": ..., "pid": ..., **fields}``), appended as one write
on a line-buffered handle, so the launcher's rendezvous (``world`` events: who joined and left, and
why) and its workers (generations, steps, checkpoints) share one file per node. Tests, benchmarks and
debugging read it; with no path configured nothing is written.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


class Journal:
    """Optional JSON-lines record of what this node did (generations, steps); tests and debugging read it."""

    def __init__(self, path: str):
        self._handle = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - lives as long as the process

    def write(self, event: str, **fields: Any) -> None:
        if self._handle is not None:
            self._handle.write(
                json.dumps({"event": event, "time": time.time(), "pid": os.getpid(), **fields}) + "\n"
            )
