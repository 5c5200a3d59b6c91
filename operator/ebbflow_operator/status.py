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
PREEMPTED = "Preempted"  # the latest preemption (status.preemptions counts them)
SUCCEEDED = "Succeeded"
FAILED = "Failed"
CONDITION_ORDER = (READY, SCHEDULABLE, PREEMPTED, SUCCEEDED, FAILED)


@dataclass(frozen=True)
class ConditionUpdate:
    """One condition a decision sets, before it is stamped with the job's generation and the time."""

    type: str
    status: bool
    reason: str
    message: str


def set_condition(
    conditions: Iterable[Condition],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> tuple[Condition, ...]:
    """Replaces (or adds) one condition; lastTransitionTime moves only when the status flips."""
    value = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    existing = {c.type: c for c in conditions}
    previous = existing.get(type_)
    since = previous.last_transition_time if previous and previous.status == value else now
    existing[type_] = Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since,
    )
    order = {name: i for i, name in enumerate(CONDITION_ORDER)}
    return tuple(sorted(existing.values(), key=lambda c: (order.get(c.type, len(order)), c.type)))


def set_conditions(
    conditions: Iterable[Condition], updates: Iterable[ConditionUpdate], generation: int, now: str
) -> tuple[Condition, ...]:
    """Applies each update in turn (see `set_condition`)."""
    result = tuple(conditions)
    for update in updates:
        result = set_condition(
            result, update.type, update.status, update.reason, update.message, generation, now
        )
    return result


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
