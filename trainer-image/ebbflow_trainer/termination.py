"""Why the trainer stopped, in the pod's status: the kubelet copies the container's termination
message file (``contract.ENV_TERMINATION_MESSAGE_PATH``) into ``state.terminated.message``, and the
operator quotes it in the job's Failed condition. Best effort: the exit code alone still fails the job.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def write_termination_message(path: str, why: str) -> None:
    if not path:
        return
    try:
        Path(path).write_text(why)
    except OSError as error:
        log.warning("cannot write the termination message to %s: %s", path, error)
