"""The workers' forkserver forked from the launcher, which has imported torch already, not spawned.

Python's multiprocessing starts its forkserver as a new interpreter, which imports torch again
(seconds of CPU on every pod start). Forked from the launcher while the launcher has one thread, the
forkserver begins with everything the launcher imported and then runs multiprocessing's own
forkserver loop, preloading `ebbflow_trainer.launch.preload` as before; workers are forked from it as
before, and torch elastic finds it running. Where the launcher already has other threads (forking
them is unsafe) or the standard library's forkserver differs from the one this was written for,
multiprocessing starts it the usual way.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from collections.abc import Sequence
from multiprocessing import forkserver, resource_tracker, util
from typing import Any

log = logging.getLogger(__name__)


def _fork_forkserver(path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
    """`util.spawnv_passfds`' place while the forkserver starts: `args` end in `-c <command>`, which
    the child runs here instead of in a new interpreter, keeping only `passfds` and stdio open."""
    command = args[-1]
    pid = os.fork()
    if pid:
        return pid
    status = 0
    try:
        keep = sorted({0, 1, 2, *passfds})
        for low, high in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
            os.closerange(low + 1, high)
        # The parent holds the forkserver's lock while it starts it; this process needs its own.
        forkserver._forkserver._lock = threading.Lock()  # type: ignore[attr-defined]
        exec(command, {"__name__": "__forkserver__"})
    except SystemExit:
        pass  # the forkserver's loop ends so once every client has gone
    except BaseException:
        # What a spawned forkserver would print before dying; the launcher's code must not run on.
        traceback.print_exc()
        status = 1
    os._exit(status)


def start() -> bool:
    """Start the forkserver now, forked from this process when that is safe; True when it was."""
    server: Any = getattr(forkserver, "_forkserver", None)
    if threading.active_count() != 1 or server is None or not hasattr(util, "spawnv_passfds"):
        log.info("starting the workers' forkserver as a new interpreter")
        return False
    resource_tracker.ensure_running()
    spawn = util.spawnv_passfds
    util.spawnv_passfds = _fork_forkserver  # type: ignore[assignment]
    try:
        server.ensure_running()
    finally:
        util.spawnv_passfds = spawn
    return True
