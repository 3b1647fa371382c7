"""JSON schemas shipped with debug_module, and a small validator for the subset of JSON Schema they use.

    from debug_module.schemas import load_schema, validate
    errors = validate(json.loads(output), load_schema("cli-output"))   # [] when valid
"""

from __future__ import annotations

import json
import re
from importlib import resources

from debug_framework.jsonio import JsonObject

__all__ = ["load_schema", "validate"]

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def load_schema(name: str) -> JsonObject:
    """A schema file of this package by stem (``"cli-output"``)."""
    return json.loads(resources.files(__package__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8"))


def validate(instance: object, schema: JsonObject, *, root: JsonObject | None = None, path: str = "$") -> list[str]:
    """Errors of ``instance`` against ``schema`` (draft 2020-12 subset: type, const, enum, properties,
    required, additionalProperties, items, minimum, pattern, $ref to #/$defs, oneOf, anyOf, allOf, if/then)."""
    root = root if root is not None else schema
    errors: list[str] = []
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            return [f"{path}: unsupported $ref {ref}"]
        errors += validate(instance, root["$defs"][ref.removeprefix("#/$defs/")], root=root, path=path)
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        if not any(_TYPES[x](instance) for x in types):
            return errors + [f"{path}: expected {'/'.join(types)}, got {type(instance).__name__}"]
    if "const" in schema and instance != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}, got {instance!r}")
    if "enum" in schema and instance not in schema["enum"]:
        errors.append(f"{path}: {instance!r} not in {schema['enum']!r}")
    if "minimum" in schema and _TYPES["number"](instance) and instance < schema["minimum"]:
        errors.append(f"{path}: {instance} < minimum {schema['minimum']}")
    if "pattern" in schema and isinstance(instance, str) and not re.search(schema["pattern"], instance):
        errors.append(f"{path}: {instance!r} does not match {schema['pattern']!r}")
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in instance:
                errors.append(f"{path}: missing required property {key!r}")
        for key, value in instance.items():
            if key in props:
                errors += validate(value, props[key], root=root, path=f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected property {key!r}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += validate(value, schema["additionalProperties"], root=root, path=f"{path}.{key}")
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(instance):
            errors += validate(item, schema["items"], root=root, path=f"{path}[{i}]")
    for sub in schema.get("allOf", []):
        errors += validate(instance, sub, root=root, path=path)
    if "anyOf" in schema and not any(not validate(instance, s, root=root, path=path) for s in schema["anyOf"]):
        errors.append(f"{path}: matches none of anyOf")
    if "oneOf" in schema:
        n = sum(not validate(instance, s, root=root, path=path) for s in schema["oneOf"])
        if n != 1:
            errors.append(f"{path}: matches {n} of oneOf (need exactly 1)")
    if "if" in schema and not validate(instance, schema["if"], root=root, path=path):
        if "then" in schema:
            errors += validate(instance, schema["then"], root=root, path=path)
    return errors
