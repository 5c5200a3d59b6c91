"""The base of the API's pydantic models: Kubernetes-style object parts (camelCase on the wire,
immutable once parsed), objects that keep what they do not declare, and the OpenAPI formats the
CRD's schema carries (`ebbflow_api.schema` reads them).

Invariant: every class of `ebbflow_api.models` derives from `ApiModel`, so each is serialized the
way the API server stores it (`to_json`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from .rules import Rule


class SchemaFormat:
    """Annotated marker: the OpenAPI `format` of a field (`date-time`, `int64`)."""

    def __init__(self, name: str) -> None:
        self.name = name


DateTime = Annotated[str, SchemaFormat("date-time")]
Int64 = Annotated[int, SchemaFormat("int64")]


class ApiModel(BaseModel):
    """A Kubernetes-style object part: camelCase on the wire, immutable once parsed.

    `cel_rules` become the object's `x-kubernetes-validations`; `preserve_unknown` models keep
    fields they do not declare (the pod template), others drop them (the API server prunes them).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        frozen=True,
        extra="ignore",
    )
    cel_rules: ClassVar[tuple[Rule, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        """The object as the API writes it: camelCase keys, unset optional fields left out."""
        return self.model_dump(mode="json", exclude_none=True)


class OpenModel(ApiModel):
    """An object that keeps what it does not declare (x-kubernetes-preserve-unknown-fields)."""

    model_config = ConfigDict(extra="allow")

    def to_json(self) -> dict[str, Any]:
        """Exactly what was given (fields left unset stay absent), extras included."""
        return self.model_dump(mode="json", exclude_unset=True)
