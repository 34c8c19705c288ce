"""The LAPSCluster CRD's openAPIV3Schema as a Draft 7 JSON Schema, plus the API server's
defaulting, so tests can check CRs the way `kubectl apply --validate=strict` would (minus CEL
rules, which no Python package here evaluates: those are mirrored by laps_operator.spec.cluster)."""
from __future__ import annotations

import copy
import pathlib
from typing import Any

import jsonschema
import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]
CRD_PATH = REPO / "charts" / "laps" / "crds" / "lapscluster.yaml"  # generated: laps_operator.spec.crd
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def load_crd(path: pathlib.Path = CRD_PATH) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def openapi_schema(crd: dict[str, Any], version: str = "v1alpha1") -> dict[str, Any]:
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]


def to_draft7(schema: Any) -> Any:
    """Map the OpenAPI dialect to JSON Schema: drop x-kubernetes-* keys, turn `nullable` and
    int-or-string into type unions, list-type `set` into uniqueItems, and make objects without
    preserve-unknown-fields strict (what the server's strict field validation reports)."""
    if isinstance(schema, list):
        return [to_draft7(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: to_draft7(v) for k, v in schema.items()
           if not k.startswith("x-kubernetes-") and k != "nullable"}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if (schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def validator(crd: dict[str, Any] | None = None) -> jsonschema.Draft7Validator:
    schema = to_draft7(openapi_schema(crd or load_crd()))
    # metadata is the server's business, except for what a CRD may restrict there: name and
    # generateName (the server checks those against the schema, and the rest as ObjectMeta).
    metadata = schema["properties"]["metadata"]
    metadata.pop("additionalProperties", None)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def errors(doc: dict[str, Any], crd: dict[str, Any] | None = None) -> list[str]:
    """Readable messages, one per violation, each prefixed with the field path."""
    found = sorted(validator(crd).iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in found]


def apply_defaults(doc: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it: a missing property with a `default`
    gets it (then is defaulted itself), recursively through objects and arrays."""
    doc = copy.deepcopy(doc)
    if isinstance(doc, dict) and schema.get("type") == "object":
        for name, sub in (schema.get("properties") or {}).items():
            if name not in doc and "default" in sub:
                doc[name] = copy.deepcopy(sub["default"])
            if name in doc:
                doc[name] = apply_defaults(doc[name], sub)
    elif isinstance(doc, list) and isinstance(schema.get("items"), dict):
        doc = [apply_defaults(item, schema["items"]) for item in doc]
    return doc
