"""What kube-apiserver does with a custom object against its CRD's structural schema (the
version's `openAPIV3Schema`), on every create and update, main endpoint or /status:

1. pruning: fields the schema does not declare are dropped silently, unless a
   `x-kubernetes-preserve-unknown-fields: true` covers them (an operator that writes an
   undeclared status field loses it on a real cluster, and here too); with
   `?fieldValidation=Strict` (kubectl's and Helm's default) an undeclared field is instead a
   400 naming it, as kube-apiserver answers (`strict decoding error: unknown field "spec.x"`);
2. nulls: a null where the schema does not say `nullable: true` is dropped (then defaulted);
3. defaulting: an absent property with a `default` gets it, top-down, so defaults inside a
   defaulted `{}` apply as well;
4. validation: the OpenAPI v3 constraints (type, enum, required, minimum, pattern, ...),
   with `x-kubernetes-int-or-string`; a violation is 422 Invalid naming the field.

Not emulated: CEL rules (`x-kubernetes-validations`), `x-kubernetes-embedded-resource`,
list-type uniqueness, formats.
"""
from __future__ import annotations

import contextvars
import copy
from collections.abc import Callable
from typing import Any

import jsonschema

from tests.support import kube_emulator_rules as rules

_ROOT_KEPT = ("apiVersion", "kind", "metadata")  # the server handles these itself
# The request's `fieldValidation` ("Strict", "Warn", "Ignore" or ""), set by the emulator around
# each request it serves.
FIELD_VALIDATION: contextvars.ContextVar[str] = contextvars.ContextVar("field_validation", default="")


def _prune_and_default(value: Any, schema: dict, path: str = "", unknown: list[str] | None = None) -> Any:
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        result = {}
        for key, item in value.items():
            sub = (properties or {}).get(key)
            if sub is None and isinstance(additional, dict):
                sub = additional
            where = f"{path}.{key}" if path else key
            if sub is None:
                if keep_unknown or additional is True:
                    result[key] = item
                elif unknown is not None:
                    unknown.append(where)
                continue
            if item is None and not sub.get("nullable"):
                continue
            result[key] = _prune_and_default(item, sub, where, unknown)
        for key, sub in (properties or {}).items():
            if key not in result and "default" in sub:
                result[key] = _prune_and_default(copy.deepcopy(sub["default"]), sub)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune_and_default(item, schema["items"], f"{path}[{i}]", unknown) for i, item in enumerate(value)]
    return value


def _as_json_schema(schema: Any) -> Any:
    """OpenAPI v3 (Kubernetes dialect) to JSON Schema draft 7."""
    if isinstance(schema, list):
        return [_as_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    result = {k: _as_json_schema(v) for k, v in schema.items()
              if not k.startswith("x-kubernetes-") and k not in ("nullable", "format", "default")}
    if schema.get("x-kubernetes-int-or-string"):
        result.pop("type", None)
        result["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in result:
        result["type"] = [result["type"], "null"]
    return result


def _field_path(error: jsonschema.ValidationError) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or "<root>"


def object_checker(open_api_schema: dict) -> Callable[[dict], None]:
    """A store validator for one served version: prunes and defaults the object in place,
    then raises 422 for the first violations."""
    root = copy.deepcopy(open_api_schema)
    root.setdefault("properties", {})
    for key in _ROOT_KEPT:
        root["properties"][key] = {"x-kubernetes-preserve-unknown-fields": True}
    validator = jsonschema.Draft7Validator(_as_json_schema(root))

    def check(obj: dict) -> None:
        kept = {key: obj[key] for key in _ROOT_KEPT if key in obj}
        unknown: list[str] = []
        shaped = _prune_and_default({k: v for k, v in obj.items() if k not in _ROOT_KEPT}, root, "", unknown)
        if unknown and FIELD_VALIDATION.get() == "Strict":
            raise rules.bad_request("strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
        obj.clear()
        obj.update(kept | shaped)
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            raise rules.invalid("; ".join(
                f"{_field_path(e)}: Invalid value: {e.message}" for e in errors[:5]))

    return check
