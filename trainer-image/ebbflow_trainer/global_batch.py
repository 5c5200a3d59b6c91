"""Batch-size co-adaptation (Pollux): the global batch B the operator's goodput policy chose, read by
rank 0 and switched to by every worker at the same step boundary.

Only a job with ``spec.maxGlobalBatchSize`` (``config.max_global_batch_size``) changes B; without it
the file is never read and the step's message is the same as before the feature existed. The
invariants:

- Rank 0 alone reads the file (the kubelet's projection of the pod's annotation), at most once a
  second (:mod:`ebbflow_trainer.projected`). An empty, missing or unreadable file asks for nothing.
  After a world re-forms its rank 0 reads its own pod's file (the operator annotates every worker
  pod alike); until a request arrives, the world keeps the B of the state it resumed from.
- A value the spec does not allow (not a whole number, below ``globalBatchSize``, above
  ``maxGlobalBatchSize``, not a multiple of V; :func:`ebbflow_trainer.config.batch_violation`) is
  ignored with one log line per distinct file content (per rank-0 process), never sent.
- The allowed value travels in the step's own all-reduce, in base-256 digits written by rank 0 and
  zero elsewhere (integers up to 256 are exact in every floating-point message, bfloat16 included),
  so every worker reads the same request from the same reduced message: no extra round trip. A
  request carried by step s's message applies from step s + 1 on every worker.
- V stays fixed; the samples per virtual node become B / V. The data position is anchored where B
  changed (:class:`ebbflow_trainer.sharding.DataPosition`): no sample is skipped or repeated across
  the switch. The anchor is part of the handed-over and checkpointed state, so a new world (and a
  newcomer in it) continues with the B of the state it receives, not the one its environment names.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ebbflow_trainer.config import TrainerConfig, batch_violation
from ebbflow_trainer.projected import ProjectedFile

log = logging.getLogger("ebbflow_trainer.global_batch")

# Integers up to 256 are exact in every float dtype (bfloat16 has 8 significant bits).
DIGIT_BASE = 256
IGNORED_LOG = "ignoring the global batch size %r in %s: %s"
MAX_LOGGED = 40  # characters of an ignored file's content in its log line


@dataclass(frozen=True)
class Request:
    """What a file's content asks for: ``batch`` (None: nothing) and, for an ignored value, why."""

    batch: int | None
    ignored: str | None = None


def requested_batch(text: str, config: TrainerConfig) -> Request:
    """The global batch ``text`` (the file's content: a decimal integer, or empty) asks for, checked
    against the spec's range and rules."""
    value = text.strip()
    if not value:
        return Request(None)
    if not re.fullmatch("[0-9]+", value):
        return Request(None, "not a whole number of samples")
    batch = int(value)
    why = batch_violation(config, batch)
    return Request(None, why) if why is not None else Request(batch)


class RequestFile:
    """Rank 0's reader of the global-batch-size file: the allowed B it asks for, 0 for none."""

    def __init__(self, config: TrainerConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.file = ProjectedFile(config.global_batch_size_file, log, "the global batch size", clock)
        self._batch = 0

    def poll(self) -> int:
        """The B to send with this step (0: no request); reads the file when the interval has passed."""
        text = self.file.changed()
        if text is not None:
            request = requested_batch(text, self.config)
            if request.ignored is not None:
                log.warning(IGNORED_LOG, text.strip()[:MAX_LOGGED], self.file.path, request.ignored)
            self._batch = request.batch or 0
        return self._batch


def digits(config: TrainerConfig) -> int:
    """Message values the request takes: 0 without ``maxGlobalBatchSize`` (the message is unchanged),
    else enough base-256 digits for the largest allowed B."""
    largest = config.max_global_batch_size or 0
    count = 0
    while largest:
        largest //= DIGIT_BASE
        count += 1
    return count


def encode(batch: int, count: int) -> list[int]:
    """``batch`` in ``count`` base-256 digits, least significant first (0 encodes "no request")."""
    values = []
    for _ in range(count):
        batch, digit = divmod(batch, DIGIT_BASE)
        values.append(digit)
    if batch:
        raise ValueError(f"{count} base-{DIGIT_BASE} digits cannot hold the batch")
    return values


def decode(values: Sequence[float]) -> int:
    """The request carried by reduced digits (0: none)."""
    return sum(round(value) * DIGIT_BASE**place for place, value in enumerate(values))
