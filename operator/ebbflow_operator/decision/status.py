"""Status helpers: conditions that keep their transition time, and JSON merge-patch diffs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ebbflow_api.models import Condition, ConditionStatus

from .model import Json

# Condition types on an ElasticTrainingJob.
READY = "Ready"  # at least min workers are running
SCHEDULABLE = "Schedulable"  # the allocator found GPUs for at least min workers
ADMITTED = "Admitted"  # under Kueue: a Workload slice of the job is admitted (decision/kueue.py)
PREEMPTED = "Preempted"  # the latest preemption (status.preemptions counts them)
# A worker asked to leave was killed past its leave grace (contract.EXIT_LEAVE_TIMED_OUT; latest one).
LEAVE_TIMED_OUT = "LeaveTimedOut"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
CONDITION_ORDER = (READY, SCHEDULABLE, ADMITTED, PREEMPTED, LEAVE_TIMED_OUT, SUCCEEDED, FAILED)


@dataclass(frozen=True)
class ConditionUpdate:
    """One condition a decision sets, before it is stamped with the job's generation and the time."""

    type: str
    status: bool
    reason: str
    message: str


def set_conditions(
    conditions: Iterable[Condition], updates: Iterable[ConditionUpdate], generation: int, now: str
) -> tuple[Condition, ...]:
    """Sets each update's condition (replaced or added), a later update of a type winning, and
    returns them in CONDITION_ORDER (then by type). lastTransitionTime moves only when the status
    differs from the one in `conditions`: what the API holds, not an update earlier in the list.
    """
    before = {c.type: c for c in conditions}
    existing = dict(before)
    for update in updates:
        value = ConditionStatus.TRUE if update.status else ConditionStatus.FALSE
        previous = before.get(update.type)
        since = previous.last_transition_time if previous and previous.status == value else now
        existing[update.type] = Condition(
            type=update.type,
            status=value,
            reason=update.reason,
            message=update.message,
            observed_generation=generation,
            last_transition_time=since,
        )
    return tuple(sorted(existing.values(), key=_condition_rank))


_RANK = {name: i for i, name in enumerate(CONDITION_ORDER)}


def _condition_rank(condition: Condition) -> tuple[int, str]:
    return _RANK.get(condition.type, len(_RANK)), condition.type


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Json:
    """The RFC 7386 merge patch that turns `old` into `new` (None deletes a key); {} when equal."""
    patch: Json = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif value != before or key not in old:
            patch[key] = value
    return patch
