"""The operator's cache keeps the newest version of each object whatever order events, write answers
and full lists arrive in (resourceVersions decide)."""

from __future__ import annotations

from typing import Any

import pytest
from ebbflow_operator.cache import Store


def obj(name: str, version: int, uid: str = "") -> dict[str, Any]:
    metadata = {"namespace": "ns", "name": name, "resourceVersion": str(version), "uid": uid or f"{name}-1"}
    return {"metadata": metadata}


def names(store: Store[dict[str, Any]]) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in store.values()}


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ([("apply", obj("a", 5))], {"a": "5"}),
        ([("apply", obj("a", 5)), ("apply", obj("a", 3))], {"a": "5"}),
        ([("apply", obj("a", 5)), ("delete", obj("a", 6))], {}),
        ([("delete", obj("a", 6)), ("apply", obj("a", 5))], {}),
        ([("apply", obj("a", 5)), ("delete", obj("a", 6)), ("apply", obj("a", 9, "a-2"))], {"a": "9"}),
        ([("apply", obj("a", 9)), ("delete", obj("a", 6))], {}),
        ([("delete", obj("a", 6)), ("apply", obj("a", 9))], {}),
        ([("apply", obj("a", 9, "a-2")), ("delete", obj("a", 6))], {"a": "9"}),
        ([("apply", obj("a", 5)), ("list", ([obj("a", 4), obj("b", 4)], 4))], {"a": "5", "b": "4"}),
        ([("apply", obj("stale", 2)), ("list", ([obj("b", 4)], 4))], {"b": "4"}),
        ([("apply", obj("new", 7)), ("list", ([obj("b", 4)], 4))], {"b": "4", "new": "7"}),
        ([("delete", obj("gone", 8)), ("list", ([obj("gone", 4)], 4))], {}),
        ([("list", ([obj("a", 4)], 4)), ("apply", obj("a", 6))], {"a": "6"}),
    ],
    ids=[
        "event",
        "late-event",
        "delete",
        "late-add-after-delete",
        "recreated",
        "deletion-is-final-whatever-the-version",
        "no-resurrection-by-a-late-answer",
        "deleting-the-old-keeps-the-recreated",
        "list-older-than-event",
        "list-drops-vanished",
        "list-keeps-newer-creation",
        "list-does-not-resurrect",
        "event-after-list",
    ],
)
def test_store_keeps_the_newest_version(steps: list[tuple[str, Any]], expected: dict[str, str]) -> None:
    store: Store[dict[str, Any]] = Store(lambda raw: raw)
    for action, argument in steps:
        if action == "apply":
            store.apply(argument)
        elif action == "delete":
            store.apply(argument, deleted=True)
        else:
            store.replace(*argument)
    assert names(store) == expected


def test_unreadable_objects_are_skipped() -> None:
    store: Store[int] = Store(lambda raw: int(raw["metadata"]["name"]))
    store.replace([obj("1", 1), obj("x", 1)], 1)
    store.apply(obj("y", 2))
    assert store.values() == [1]
