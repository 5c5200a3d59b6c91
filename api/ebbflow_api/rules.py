"""Validation rules in CEL, written once and evaluated in two places.

The API server evaluates them (they become `x-kubernetes-validations` in the generated CRD), and
Python evaluates the same text with cel-python (`violations`): the trainer checks its configuration
with them, and unit tests check a manifest without a cluster. A rule is therefore never spelled a
second time in Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError


@dataclass(frozen=True)
class Rule:
    """One CEL rule on an object (`self`); `message` names the field and the fix."""

    rule: str
    message: str
    field_path: str | None = None  # relative to the object, e.g. ".virtualNodes"
    reason: str | None = None  # FieldValueInvalid, FieldValueForbidden, ...

    def schema(self) -> dict[str, Any]:
        """The entry of `x-kubernetes-validations`."""
        entry: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.reason:
            entry["reason"] = self.reason
        if self.field_path:
            entry["fieldPath"] = self.field_path
        return entry


@cache
def _program(expression: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def evaluate(expression: str, self: Mapping[str, Any]) -> Any:
    """A CEL expression over `self` (plain JSON), as a Python value."""
    result = _program(expression).evaluate({"self": json_to_cel(dict(self))})
    if isinstance(result, CELEvalError):
        raise ValueError(f"CEL {expression!r}: {result}")
    if isinstance(result, celtypes.BoolType):
        return bool(result)
    if isinstance(result, celtypes.IntType):
        return int(result)
    return result


def violations(rules: tuple[Rule, ...], self: Mapping[str, Any]) -> list[Rule]:
    """The rules `self` breaks, in order."""
    return [rule for rule in rules if not evaluate(rule.rule, self)]
