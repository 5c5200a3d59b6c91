"""The operator's cache keeps the newest version of each object whatever order events, write answers
and full lists arrive in (resourceVersions decide)."""

from __future__ import annotations

import logging
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


def parse_number(raw: dict[str, Any]) -> int:
    return int(raw["metadata"]["name"])


def test_an_unparsable_object_is_logged_and_counted_once(caplog: pytest.LogCaptureFixture) -> None:
    counted: list[None] = []
    store: Store[int] = Store(parse_number, "numbers", lambda: counted.append(None))
    with caplog.at_level(logging.WARNING, logger="ebbflow_operator.cache"):
        for _ in range(3):  # relists, and events in between, bring the same version again
            store.replace([obj("1", 1), obj("x", 1)], 1)
            store.apply(obj("x", 1))
        assert len(counted) == 1
        store.apply(obj("x", 2))  # a new version of it is news
        store.replace([obj("1", 1), obj("x", 2)], 2)
    assert store.values() == [1]
    assert len(counted) == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "numbers ns/x at resourceVersion 1" in warnings[0].getMessage()
    assert "invalid literal for int()" in warnings[0].getMessage()


def test_a_valid_object_still_goes_in_next_to_an_unparsable_one() -> None:
    store: Store[int] = Store(parse_number)
    store.apply(obj("x", 1))
    store.apply(obj("2", 1))
    store.replace([obj("x", 3), obj("3", 3)], 3)
    store.apply(obj("4", 4))
    assert sorted(store.values()) == [3, 4]


def test_the_same_version_again_keeps_the_parsed_object_and_is_not_parsed_again() -> None:
    """A write's answer, then its watch event, then a relist: one version, parsed once, one object
    (a pass tells by identity that nothing changed)."""
    parsed: list[str] = []

    def parse(raw: dict[str, Any]) -> dict[str, Any]:
        parsed.append(raw["metadata"]["resourceVersion"])
        return dict(raw)

    store: Store[dict[str, Any]] = Store(parse)
    store.apply(obj("a", 5))
    [first] = store.values()
    store.apply(obj("a", 5))
    store.replace([obj("a", 5), obj("b", 6)], 6)
    assert store.values()[0] is first
    assert parsed == ["5", "6"]
    store.apply(obj("a", 7))
    assert store.values()[0] is not first and parsed == ["5", "6", "7"]
