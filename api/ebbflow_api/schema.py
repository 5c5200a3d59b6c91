"""Structural OpenAPI v3 schemas (what a CRD needs) generated from the pydantic models.

pydantic's own JSON Schema uses `$ref`, `anyOf` and titles, which a CRD may not contain, so this
walks the models' fields directly: Python types become OpenAPI types, `Field` bounds become
minimum/maximum (exclusive for `gt`/`lt`) and length limits, `cel_rules` and field-level
`x-kubernetes-*` extras are copied. A bound pydantic enforces and the CRD does not would let the API
server store a job the operator cannot parse.
Spec models carry their defaults (the API server applies them); status models do not.
"""

from __future__ import annotations

import types
from enum import Enum
from typing import Annotated, Any, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .base import ApiModel, OpenModel, SchemaFormat

Schema = dict[str, Any]
INT32_MAX = 2**31 - 1


def model_schema(model: type[BaseModel], defaults: bool = True) -> Schema:
    """The structural schema of an object model (its fields, rules, required list)."""
    schema: Schema = {"type": "object"}
    if model.__doc__ and model.__doc__ != ApiModel.__doc__ and model.__doc__ != OpenModel.__doc__:
        schema["description"] = " ".join(model.__doc__.split())
    required = [info.alias or name for name, info in model.model_fields.items() if info.is_required()]
    if required:
        schema["required"] = required
    if issubclass(model, OpenModel):
        schema["x-kubernetes-preserve-unknown-fields"] = True
    schema["properties"] = {
        info.alias or name: field_schema(info, defaults) for name, info in model.model_fields.items()
    }
    rules = getattr(model, "cel_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.schema() for rule in rules]
    return schema


def field_schema(info: FieldInfo, defaults: bool) -> Schema:
    """One field: its type's schema, then its description, bounds, default and extras."""
    schema = type_schema(info.annotation, info.metadata, defaults)
    if info.description:
        schema["description"] = info.description
    if defaults:
        default = _default(info)
        if default is not None:
            schema["default"] = default
    extra = info.json_schema_extra
    if isinstance(extra, dict):
        schema.update(extra)
    return schema


def _default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        made = info.default_factory()  # type: ignore[call-arg]
        # An object defaults to {}: the API server then applies the defaults of its own fields.
        return {} if isinstance(made, BaseModel) else made
    if info.default is PydanticUndefined or info.default is None:
        return None
    return info.default.value if isinstance(info.default, Enum) else info.default


def type_schema(annotation: Any, metadata: list[Any], defaults: bool) -> Schema:
    """A Python type (with its Annotated/Field metadata) as a structural schema."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_schema(args[0], [*args[1:], *metadata], defaults)
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        if set(present) == {int, str}:
            return _constrained({"x-kubernetes-int-or-string": True}, metadata)
        [inner] = present
        return type_schema(inner, metadata, defaults)
    if origin is list:
        return _constrained({"type": "array", "items": type_schema(args[0], [], defaults)}, metadata)
    if origin is dict:
        values = args[1]
        extra = (
            {"x-kubernetes-preserve-unknown-fields": True}
            if values is Any
            else {"additionalProperties": type_schema(values, [], defaults)}
        )
        return _constrained({"type": "object", **extra}, metadata)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return {"type": "string", "enum": [member.value for member in annotation]}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_schema(annotation, defaults)
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return _constrained({"type": simple[annotation]}, metadata)


def _constrained(schema: Schema, metadata: list[Any]) -> Schema:
    """Applies bounds, lengths, patterns and formats to a scalar, array or map schema."""
    kind = schema.get("type")
    size = {"string": "Length", "array": "Items", "object": "Properties"}.get(kind or "", "Length")
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            schema["minimum"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            schema |= {"minimum": item.gt, "exclusiveMinimum": True}
        elif isinstance(item, annotated_types.Le):
            schema["maximum"] = item.le
        elif isinstance(item, annotated_types.Lt):
            schema |= {"maximum": item.lt, "exclusiveMaximum": True}
        elif isinstance(item, annotated_types.MinLen):
            schema[f"min{size}"] = item.min_length
        elif isinstance(item, annotated_types.MaxLen):
            schema[f"max{size}"] = item.max_length
        elif isinstance(item, SchemaFormat):
            schema["format"] = item.name
        elif getattr(item, "pattern", None):
            schema["pattern"] = item.pattern
        elif isinstance(item, FieldInfo) and isinstance(item.json_schema_extra, dict):
            schema.update(item.json_schema_extra)
            schema = _constrained(schema, item.metadata)
    if kind == "integer" and "format" not in schema:
        bounded = abs(schema.get("maximum", INT32_MAX + 1)) <= INT32_MAX
        schema["format"] = "int32" if bounded else "int64"
    return schema
