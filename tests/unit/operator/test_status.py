"""Status helpers: RFC 7386 merge-patch diffs and conditions that keep their transition time (tables)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api.models import Condition, ConditionStatus
from ebbflow_operator.decision.status import (
    CONDITION_ORDER,
    FAILED,
    PREEMPTED,
    READY,
    SCHEDULABLE,
    SUCCEEDED,
    ConditionUpdate,
    merge_patch,
    set_conditions,
)

Json = dict[str, Any]
T0 = "2024-01-01T00:00:00Z"
T1 = "2024-01-01T00:05:00Z"


def apply_merge_patch(target: object, patch: object) -> object:
    """RFC 7386 section 2, written out independently: the reference the diffs are checked against."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: Json = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


# --- merge_patch ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        pytest.param({}, {}, {}, id="both-empty"),
        pytest.param({"a": 1, "b": {"c": [1, 2]}}, {"a": 1, "b": {"c": [1, 2]}}, {}, id="equal"),
        pytest.param({"a": 1, "b": 2}, {"a": 1}, {"b": None}, id="removed-key"),
        pytest.param({"a": {"x": 1}}, {}, {"a": None}, id="removed-object"),
        pytest.param({"a": 1}, {"a": 1, "b": 2}, {"b": 2}, id="new-key"),
        pytest.param({}, {"a": {"b": {"c": 1}}}, {"a": {"b": {"c": 1}}}, id="new-nested-object"),
        pytest.param({"a": 1}, {"a": 2}, {"a": 2}, id="changed-scalar"),
        pytest.param({"a": 1}, {"a": "1"}, {"a": "1"}, id="changed-type"),
        pytest.param(
            {"s": {"phase": "Pending", "replicas": 2}},
            {"s": {"phase": "Running", "replicas": 2}},
            {"s": {"phase": "Running"}},
            id="nested-diff-only",
        ),
        pytest.param(
            {"s": {"a": {"b": 1, "c": 2}}},
            {"s": {"a": {"b": 1}}},
            {"s": {"a": {"c": None}}},
            id="nested-remove",
        ),
        pytest.param(
            {"s": {"a": 1}, "t": 2}, {"s": {"a": 1}, "t": 3}, {"t": 3}, id="equal-nested-object-left-out"
        ),
        pytest.param({"l": [1, 2, 3]}, {"l": [1, 2]}, {"l": [1, 2]}, id="list-shrunk-replaced-whole"),
        pytest.param({"l": [1, 2]}, {"l": [1, 3]}, {"l": [1, 3]}, id="list-item-changed-replaced-whole"),
        pytest.param(
            {"c": [{"type": "Ready", "status": "False"}, {"type": "Failed", "status": "False"}]},
            {"c": [{"type": "Ready", "status": "True"}, {"type": "Failed", "status": "False"}]},
            {"c": [{"type": "Ready", "status": "True"}, {"type": "Failed", "status": "False"}]},
            id="list-of-objects-replaced-whole",
        ),
        pytest.param({"l": [1]}, {"l": []}, {"l": []}, id="list-emptied"),
        pytest.param({"a": {"b": 1}}, {"a": 5}, {"a": 5}, id="object-to-scalar"),
        pytest.param({"a": 5}, {"a": {"b": 1}}, {"a": {"b": 1}}, id="scalar-to-object"),
        pytest.param({"a": [1]}, {"a": {"b": 1}}, {"a": {"b": 1}}, id="list-to-object"),
        pytest.param({"a": {"b": 1}}, {"a": {}}, {"a": {"b": None}}, id="object-emptied"),
        pytest.param({"a": {}}, {"a": {}}, {}, id="equal-empty-objects"),
        pytest.param({}, {"a": {}}, {"a": {}}, id="new-empty-object"),
    ],
)
def test_merge_patch(old: Json, new: Json, patch: Json) -> None:
    old_copy, new_copy = copy.deepcopy(old), copy.deepcopy(new)
    assert merge_patch(old, new) == patch
    assert apply_merge_patch(old, patch) == new  # the patch really turns old into new
    assert (old, new) == (old_copy, new_copy)  # and computing it changed neither


@pytest.mark.parametrize(
    "status",
    [
        pytest.param({}, id="empty"),
        pytest.param(
            {"phase": "Running", "conditions": [{"type": "Ready"}], "workerNodes": {"w": "n"}}, id="full"
        ),
    ],
)
def test_merge_patch_of_equal_documents_is_empty(status: Json) -> None:
    assert merge_patch(status, copy.deepcopy(status)) == {}


# --- set_conditions ------------------------------------------------------------------------------


def set_condition(
    conditions: Iterable[Condition],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> tuple[Condition, ...]:
    """One update, the case most tables below check."""
    return set_conditions(conditions, (ConditionUpdate(type_, status, reason, message),), generation, now)


def condition(type_: str, status: bool, since: str = T0, reason: str = "R", generation: int = 1) -> Condition:
    return Condition(
        type=type_,
        status=ConditionStatus.TRUE if status else ConditionStatus.FALSE,
        reason=reason,
        message=f"{type_} message",
        observed_generation=generation,
        last_transition_time=since,
    )


@pytest.mark.parametrize(
    ("existing", "status", "since"),
    [
        pytest.param((), True, T1, id="added-true"),
        pytest.param((), False, T1, id="added-false"),
        pytest.param((condition(READY, True),), True, T0, id="unchanged-true-keeps-time"),
        pytest.param((condition(READY, False),), False, T0, id="unchanged-false-keeps-time"),
        pytest.param((condition(READY, False),), True, T1, id="flip-to-true-moves-time"),
        pytest.param((condition(READY, True),), False, T1, id="flip-to-false-moves-time"),
        pytest.param((condition(SCHEDULABLE, True),), True, T1, id="other-type-does-not-count"),
    ],
)
def test_set_condition_transition_time(existing: tuple[Condition, ...], status: bool, since: str) -> None:
    result = set_condition(existing, READY, status, "NewReason", "new message", 7, T1)
    [ready] = [c for c in result if c.type == READY]
    assert ready.last_transition_time == since
    assert ready.status == (ConditionStatus.TRUE if status else ConditionStatus.FALSE)
    # Everything but the transition time is always the new value.
    assert (ready.reason, ready.message, ready.observed_generation) == ("NewReason", "new message", 7)


@pytest.mark.parametrize(
    ("existing", "type_", "types"),
    [
        pytest.param((), READY, [READY], id="first"),
        pytest.param((condition(READY, True),), READY, [READY], id="replaced-not-duplicated"),
        pytest.param(
            (condition(READY, True), condition(SCHEDULABLE, True)),
            SCHEDULABLE,
            [READY, SCHEDULABLE],
            id="replaced-among-others",
        ),
        pytest.param((condition(FAILED, True),), READY, [READY, FAILED], id="added-before"),
        pytest.param((condition(READY, True),), FAILED, [READY, FAILED], id="added-after"),
        pytest.param(
            (condition(FAILED, True), condition(SUCCEEDED, False), condition(PREEMPTED, True)),
            SCHEDULABLE,
            [SCHEDULABLE, PREEMPTED, SUCCEEDED, FAILED],
            id="unordered-input-sorted",
        ),
        pytest.param(
            (condition("Zeta", True), condition(FAILED, False), condition("Alpha", True)),
            READY,
            [READY, FAILED, "Alpha", "Zeta"],
            id="unknown-types-last-by-name",
        ),
        pytest.param(
            tuple(condition(t, False) for t in reversed(CONDITION_ORDER)),
            PREEMPTED,
            list(CONDITION_ORDER),
            id="all-known-types",
        ),
    ],
)
def test_set_condition_adds_replaces_and_orders(
    existing: tuple[Condition, ...], type_: str, types: list[str]
) -> None:
    result = set_condition(existing, type_, True, "Why", "what", 2, T1)
    assert [c.type for c in result] == types
    [updated] = [c for c in result if c.type == type_]
    assert (updated.status, updated.reason, updated.message) == (ConditionStatus.TRUE, "Why", "what")
    # The other conditions come back untouched.
    untouched = {c.type: c for c in existing if c.type != type_}
    assert {c.type: c for c in result if c.type != type_} == untouched


DOCS = Path(__file__).resolve().parents[3] / "docs" / "operator.md"


def test_condition_order_is_the_documented_one() -> None:
    """docs/operator.md's table of conditions lists every type, in the order the status keeps."""
    table = DOCS.read_text().split("Conditions (type, status", 1)[1].split("\n\n", 2)[1]
    first_cells = [row.split("|")[1] for row in table.splitlines()[2:]]
    documented = [name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)]
    assert tuple(documented) == CONDITION_ORDER
    assert (READY, SCHEDULABLE, PREEMPTED, SUCCEEDED, FAILED) == (
        "Ready",
        "Schedulable",
        "Preempted",
        "Succeeded",
        "Failed",
    )


def test_set_condition_accepts_any_iterable_and_keeps_input() -> None:
    existing = [condition(READY, False), condition(FAILED, False)]
    before = list(existing)
    result = set_condition(iter(existing), READY, True, "Up", "running", 3, T1)
    assert isinstance(result, tuple)
    assert existing == before
    assert [(c.type, c.status, c.last_transition_time) for c in result] == [
        (READY, ConditionStatus.TRUE, T1),
        (FAILED, ConditionStatus.FALSE, T0),
    ]


def test_set_condition_twice_is_stable() -> None:
    """A second pass with the same observation writes nothing new (the merge patch is empty)."""
    first = set_condition((), READY, True, "Up", "running", 1, T0)
    second = set_condition(first, READY, True, "Up", "running", 1, T1)
    assert second == first
    assert (
        merge_patch(
            {"conditions": [c.to_json() for c in first]}, {"conditions": [c.to_json() for c in second]}
        )
        == {}
    )


def test_set_conditions_applies_every_update_and_the_last_of_a_type_wins() -> None:
    existing = (condition(READY, True), condition(SCHEDULABLE, False))
    updates = (
        ConditionUpdate(SCHEDULABLE, True, "Allocated", "4 worker(s)"),
        ConditionUpdate(READY, False, "First", "overridden"),
        ConditionUpdate(READY, True, "MinimumAvailable", "2 of 4"),
    )
    result = set_conditions(existing, updates, 5, T1)
    assert [(c.type, c.status, c.reason, c.last_transition_time, c.observed_generation) for c in result] == [
        # Ready ends True as it began: the False update before it is not a transition.
        (READY, ConditionStatus.TRUE, "MinimumAvailable", T0, 5),
        (SCHEDULABLE, ConditionStatus.TRUE, "Allocated", T1, 5),
    ]
