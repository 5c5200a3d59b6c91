"""Batch-size co-adaptation (Pollux): the global batch B the operator's goodput policy chose, read by
rank 0 and switched to by every worker at the same step boundary.

Only a job with ``spec.maxGlobalBatchSize`` changes B. Rank 0 alone reads the projected annotation
(at most once a second, :mod:`ebbflow_trainer.projected`); a value the spec does not allow is ignored
with one log line per distinct content; an allowed one travels in the step's own all-reduce.

Invariants: a request carried by step s's message applies from step s + 1 on every worker; V stays
fixed and the samples per virtual node become B / V; the data position is anchored where B changed,
so no sample is skipped or repeated, and the anchor is part of the handed-over state, so a new world
continues with the B of the state it receives. Details: docs/design/batch.md.
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
