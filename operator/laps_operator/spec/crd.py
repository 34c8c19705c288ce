"""The LAPSCluster CustomResourceDefinition, generated from the typed spec, and its reference.

charts/laps/crds/lapscluster.yaml (the one CRD file: the chart ships it) and docs/spec.md are
this module's output, committed; tests/unit/operator/test_crd_generated.py fails while either
differs. After changing a model in this package, regenerate both (from the repository root):

    python -m laps_operator.spec.crd --write
    # or one at a time:
    python -m laps_operator.spec.crd > charts/laps/crds/lapscluster.yaml
    python -m laps_operator.spec.crd --docs > docs/spec.md

How a model becomes a structural OpenAPI v3 schema (walked here rather than through pydantic's
JSON Schema, which needs $refs, anyOf and titles undone, and cannot tell the API server's
defaults from the operator's):

- a field's alias is its property; a field without a default is `required`;
- `default=` is the API server's default too (a model instance as the fields that differ from
  its own defaults, so `EngineSpec()` is `{}`); `default_factory=` is the operator's alone;
- int, float, bool, str, datetime, Literal, tuple/list, dict, models and TypedDicts map to their
  OpenAPI types; `int | str` is x-kubernetes-int-or-string; `dict[str, Any]` an object kept as
  written (x-kubernetes-preserve-unknown-fields), as is a model that allows extra keys;
- `X | None` in the spec is a field that may be left out; in the status (TypedDicts,
  status.py), one the operator may write as null (nullable);
- ge/le, min_length/max_length (on strings, lists or maps) and pattern become minimum/maximum,
  minLength/maxLength, minItems/maxItems, minProperties/maxProperties and pattern;
- `description` (Field's) and `json_schema_extra` (Field's, or a model's in model_config) are
  copied as they are: what only the API server checks, the x-kubernetes-* markers, CEL rules.

Anything else found on a type is an error, so no constraint is dropped without notice.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import sys
import types
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import annotated_types
import yaml
from pydantic import BaseModel, Strict, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from laps_operator.naming import CLUSTER_NAME_PATTERN, CRD_NAME, GROUP, KIND, MANAGER, MAX_CLUSTER_NAME, PLURAL, VERSION
from laps_operator.spec.cluster import ClusterSpec
from laps_operator.spec.status import ClusterStatus

CRD_FILE = "charts/laps/crds/lapscluster.yaml"
DOCS_FILE = "docs/spec.md"
REGENERATE = "python -m laps_operator.spec.crd --write"
# The sha256 of the CRD's `spec`, which templates/crd-check.yaml compares with the cluster's copy.
SPEC_SHA256 = "laps.io/spec-sha256"

SINGULAR = "lapscluster"
SHORT_NAMES = ["laps"]
PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Short", "type": "integer", "description": "prefill pods in the short group",
     "jsonPath": ".status.groupSizes.short"},
    {"name": "Long", "type": "integer", "description": "prefill pods in the long group",
     "jsonPath": ".status.groupSizes.long"},
    {"name": "Pressure-Short", "type": "number", "priority": 1, "jsonPath": ".status.pressure.short"},
    {"name": "Pressure-Long", "type": "number", "priority": 1, "jsonPath": ".status.pressure.long"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_VALIDATORS = ("AfterValidator", "BeforeValidator", "PlainValidator", "WrapValidator")


def _scalar(tp: Any) -> dict[str, Any] | None:
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is datetime:
        return {"type": "string", "format": "date-time"}
    return None


def _literal(values: tuple[Any, ...]) -> dict[str, Any]:
    kinds = {type(v) for v in values}
    if len(kinds) != 1 or (node := _scalar(kinds.pop())) is None:
        raise TypeError(f"Literal{list(values)}: one scalar type, please")
    return {**node, "enum": list(values)}


def _length(node: dict[str, Any], bound: str, value: int) -> None:
    """min_length/max_length by what they bound: a string, a list or a map."""
    suffix = {"string": "Length", "array": "Items", "object": "Properties"}.get(node.get("type", ""))
    if suffix is None:
        raise TypeError(f"a length bound on a {node.get('type')!r} node")
    node[bound + suffix] = value


def _apply(node: dict[str, Any], meta: Any) -> None:
    """One piece of a type's or a field's metadata onto its schema node."""
    if isinstance(meta, FieldInfo):
        for inner in meta.metadata:
            _apply(node, inner)
        if meta.description:
            node["description"] = meta.description
        _extra(node, meta.json_schema_extra)
    elif isinstance(meta, annotated_types.Ge):
        node["minimum"] = meta.ge
    elif isinstance(meta, annotated_types.Le):
        node["maximum"] = meta.le
    elif isinstance(meta, annotated_types.MinLen):
        _length(node, "min", meta.min_length)
    elif isinstance(meta, annotated_types.MaxLen):
        _length(node, "max", meta.max_length)
    elif isinstance(meta, Strict) or type(meta).__name__ in _VALIDATORS:
        pass  # how pydantic validates, not what
    elif type(meta).__name__ == "_PydanticGeneralMetadata":  # Field(pattern=..., strict=...)
        for key, value in vars(meta).items():
            if key == "pattern":
                node["pattern"] = value
            elif key != "strict":
                raise TypeError(f"Field({key}=...) has no CRD counterpart here")
    else:
        raise TypeError(f"{meta!r}: not a constraint the CRD generator knows")


def _extra(node: dict[str, Any], extra: Any) -> None:
    if extra is None:
        return
    if not isinstance(extra, dict):
        raise TypeError("json_schema_extra must be a dict for the CRD")
    node.update(copy.deepcopy(extra))


def _default(field: FieldInfo) -> Any:
    """The API server's default for `field`, or PydanticUndefined for none."""
    if field.default is PydanticUndefined or field.default is None:
        return PydanticUndefined  # required, left to a default_factory, or unset
    return TypeAdapter(field.annotation).dump_python(field.default, mode="json", by_alias=True,
                                                     exclude_defaults=True)


def _model(cls: type[BaseModel], status: bool) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "object"}
    if cls.model_config.get("extra") == "allow":
        # Passed on as written, its known parts checked by the operator.
        node["x-kubernetes-preserve-unknown-fields"] = True
    else:
        required, properties = [], {}
        for name, field in cls.model_fields.items():
            key = field.alias or name
            prop = _type(field.annotation, status)
            for meta in field.metadata:
                _apply(prop, meta)
            if field.description:
                prop["description"] = field.description
            if (default := _default(field)) is not PydanticUndefined:
                prop["default"] = default
            _extra(prop, field.json_schema_extra)
            properties[key] = prop
            if field.is_required():
                required.append(key)
        if required:
            node["required"] = required
        node["properties"] = properties
    _extra(node, cls.model_config.get("json_schema_extra"))
    return node


def _typeddict(cls: type, status: bool) -> dict[str, Any]:
    # Required[...] read off the hints: __required_keys__ misses it in string annotations.
    hints = get_type_hints(cls, include_extras=True)
    node: dict[str, Any] = {"type": "object"}
    required = [key for key, tp in hints.items()
                if get_origin(tp) is Required or (cls.__total__ and get_origin(tp) is not NotRequired)]
    if required:
        node["required"] = required
    node["properties"] = {key: _type(get_args(tp)[0] if get_origin(tp) in (Required, NotRequired) else tp, status)
                          for key, tp in hints.items()}
    return node


def _type(tp: Any, status: bool) -> dict[str, Any]:
    """The schema node of a type (`status`: in the status, where None is a nullable value)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        node = _type(args[0], status)
        for meta in tp.__metadata__:
            _apply(node, meta)
        return node
    if origin in (Union, types.UnionType):
        values = [a for a in args if a is not type(None)]
        if {get_origin(v) or v for v in values} == {int, str}:
            node = {"x-kubernetes-int-or-string": True}
        elif len(values) == 1:
            node = _type(values[0], status)
        else:
            raise TypeError(f"{tp}: a union the CRD cannot state")
        if status and len(values) < len(args):
            node["nullable"] = True
        return node
    if origin is Literal:
        return _literal(args)
    if (node := _scalar(tp)) is not None:
        return node
    if origin in (tuple, list):
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            raise TypeError(f"{tp}: only tuple[X, ...] is a list")
        return {"type": "array", "items": _type(args[0], status)}
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"{tp}: map keys are strings")
        if args[1] is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": _type(args[1], status)}
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _model(tp, status)
    if is_typeddict(tp):
        return _typeddict(tp, status)
    raise TypeError(f"{tp!r}: no CRD type for it")


# The order keys are written in, for people reading the file (the API server ignores it).
_KEY_ORDER = ["type", "format", "nullable", "description", "required", "enum", "minimum", "maximum", "minLength",
              "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "pattern", "default"]
_LAST = ["additionalProperties", "items", "properties"]


def _tidy(node: Any) -> Any:
    if isinstance(node, list):
        return [_tidy(n) for n in node]
    if not isinstance(node, dict):
        return node
    is_schema = "type" in node or any(k.startswith("x-kubernetes-") for k in node)

    def rank(key: str) -> tuple[int, int, str]:
        if not is_schema:
            return (0, 0, "")
        if key in _KEY_ORDER:
            return (0, _KEY_ORDER.index(key), key)
        if key in _LAST:
            return (2, _LAST.index(key), key)
        return (1, 0, key)

    out = {}
    for key in sorted(node, key=rank):
        value = node[key]
        if key == "properties" and is_schema:
            out[key] = {name: _tidy(sub) for name, sub in value.items()}
        elif key == "default":
            out[key] = value  # a value, not a schema
        else:
            out[key] = _tidy(value)
    return out


def openapi_schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema: the object, its metadata.name rule, spec and status."""
    return _tidy({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # A CRD may only restrict name and generateName here. The name prefixes the children's
            # (naming.MAX_CLUSTER_NAME says why 44).
            "metadata": {"type": "object", "properties": {"name": {
                "type": "string", "maxLength": MAX_CLUSTER_NAME, "pattern": CLUSTER_NAME_PATTERN}}},
            "spec": _type(ClusterSpec, status=False),
            "status": _type(ClusterStatus, status=True),
        },
    })


def spec_sha256(crd_spec: dict[str, Any]) -> str:
    """The fingerprint templates/crd-check.yaml compares: the sha256 of the CRD's `spec` as JSON
    (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(crd_spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition manifest."""
    spec = {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                  "shortNames": SHORT_NAMES, "categories": ["all"]},
        "versions": [{
            "name": VERSION,
            "served": True,
            "storage": True,
            "subresources": {"status": {}},
            "additionalPrinterColumns": PRINTER_COLUMNS,
            "schema": {"openAPIV3Schema": openapi_schema()},
        }],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "laps", "app.kubernetes.io/managed-by": MANAGER},
            "annotations": {SPEC_SHA256: spec_sha256(spec)},
        },
        "spec": copy.deepcopy(spec),
    }


_HEADER = f"""\
# LAPSCluster: one prefill/decode-disaggregated serving deployment with Length-Aware Prefill
# Scheduling. The operator (laps_operator) reconciles it into StatefulSets, Deployments,
# Services, a ConfigMap and (optionally) a PodMonitor.
#
# GENERATED from the typed spec (operator/laps_operator/spec/) by laps_operator.spec.crd: do not
# edit. Regenerate with `{REGENERATE}` (docs/spec.md is its reference).
# metadata.annotations[{SPEC_SHA256}] is the sha256 of this file's `spec` (JSON, sorted keys, no
# spaces). Helm never upgrades a CRD: the chart compares it with the cluster's copy and refuses to
# install or upgrade while they differ (templates/crd-check.yaml).
"""


class _Flow(dict):
    """A mapping written on one line."""


class _FlowList(list):
    """A list written on one line."""


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
        return super().increase_indent(flow, False)  # lists indented under their key


_Dumper.add_representer(_Flow, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v.items(), flow_style=True))
_Dumper.add_representer(_FlowList, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def _flows(node: Any, width: int = 72) -> Any:
    """Short mappings and lists of scalars on one line, as people write YAML."""
    if isinstance(node, list):
        items = [_flows(n) for n in node]
        if all(not isinstance(n, (dict, list)) for n in node):
            return _FlowList(items)
        return items
    if not isinstance(node, dict):
        return node
    out = {k: _flows(v) for k, v in node.items()}
    simple = all(isinstance(v, _FlowList) or (isinstance(v, _Flow) and not v) or not isinstance(v, (dict, list))
                 for v in out.values())
    if simple and "description" not in out and len(json.dumps(node)) <= width:
        return _Flow(out)
    return out


def crd_yaml() -> str:
    """charts/laps/crds/lapscluster.yaml, as committed."""
    body = yaml.dump(_flows(crd()), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return _HEADER + body


# docs/spec.md


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return f"`{_md(text)}`" if text != "" else '`""`'


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def _scalar_kind(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        kind = "integer or string"
    elif node.get("type") == "object":
        kind = "object (any fields)" if node.get("x-kubernetes-preserve-unknown-fields") else "object"
    else:
        kind = node.get("type", "any")
    if "format" in node:
        kind += f" ({node['format']})"
    return kind


def _bounds(node: dict[str, Any]) -> list[str]:
    out = []
    if "enum" in node:
        out.append("one of " + ", ".join(_code(v) for v in node["enum"]))
    for low, high, unit in (("minimum", "maximum", ""), ("minLength", "maxLength", " characters"),
                            ("minItems", "maxItems", " items"), ("minProperties", "maxProperties", " keys")):
        if low in node and high in node:
            out.append(f"{node[low]} to {node[high]}{unit}")
        elif low in node and unit and node[low] == 1:
            out.append("non-empty")
        elif low in node:
            out.append(f"≥ {node[low]}{unit}")
        elif high in node:
            out.append(f"≤ {node[high]}{unit}")
    if "pattern" in node:
        out.append(f"pattern {_code(node['pattern'])}")
    if node.get("x-kubernetes-list-type") == "set":
        out.append("no repeats")
    if node.get("x-kubernetes-list-type") == "map":
        out.append("unique " + ", ".join(node["x-kubernetes-list-map-keys"]))
    if node.get("nullable"):
        out.append("may be null")
    return out


class _Reference:
    """docs/spec.md: a table per object of the schema, each identical object documented once."""

    def __init__(self) -> None:
        self.sections: list[str] = []
        self.seen: dict[str, str] = {}
        self.pending: list[tuple[str, dict[str, Any]]] = []

    def link(self, title: str, node: dict[str, Any]) -> str:
        """The section documenting `node` (an object with properties), queued if new."""
        key = json.dumps({k: v for k, v in node.items() if k not in ("description", "default")}, sort_keys=True)
        if key not in self.seen:
            self.seen[key] = title
            self.pending.append((title, node))
        target = self.seen[key]
        return f"[{target}](#{_anchor(target)})"

    def kind(self, path: str, node: dict[str, Any]) -> tuple[str, list[str]]:
        """(type, bounds) of a property node."""
        bounds = _bounds(node)
        if node.get("type") == "object" and "properties" in node:
            return f"object: {self.link(path, node)}", bounds
        if node.get("type") == "object" and "additionalProperties" in node:
            value = node["additionalProperties"]
            kind, inner = self.kind(path + "{}", value)
            return f"map of {kind}", bounds + [f"values {b}" for b in inner]
        if node.get("type") == "array":
            kind, inner = self.kind(path + "[]", node["items"])
            return f"list of {kind}", bounds + [f"each {b}" for b in inner]
        return _scalar_kind(node), bounds

    def table(self, title: str, node: dict[str, Any], level: str) -> None:
        required = set(node.get("required", ()))
        rows = ["| field | type | default | bounds | description |", "|---|---|---|---|---|"]
        for name, prop in node["properties"].items():
            kind, bounds = self.kind(f"{title}.{name}", prop)
            default = "required" if name in required else _code(prop["default"]) if "default" in prop else ""
            rows.append(f"| `{name}` | {kind} | {default} | {'; '.join(bounds)} | {_md(prop.get('description', ''))} |")
        lead = [_md(node["description"]), ""] if "description" in node else []
        if node.get("x-kubernetes-preserve-unknown-fields"):
            lead += ["Other keys are kept as written and passed to the operator.", ""]
        self.sections.append("\n".join([f"{level} {title}", "", *lead, *rows, ""]))

    def walk(self, title: str, node: dict[str, Any]) -> None:
        """`node` as section `## title`, and the objects in it as `### ...` sections after it."""
        self.link(title, node)
        level = "##"
        while self.pending:
            self.table(*self.pending.pop(0), level)
            level = "###"


def _rules(spec: dict[str, Any]) -> Iterator[str]:
    yield "| field | rule (CEL) | message |"
    yield "|---|---|---|"
    for rule in spec["x-kubernetes-validations"]:
        yield f"| `spec{rule['fieldPath']}` | {_code(rule['rule'])} | {_md(rule['message'])} |"


def docs_markdown() -> str:
    """docs/spec.md, as committed."""
    schema = openapi_schema()
    spec, status = schema["properties"]["spec"], schema["properties"]["status"]
    name = schema["properties"]["metadata"]["properties"]["name"]
    lines = [
        "# LAPSCluster reference",
        "",
        f"<!-- GENERATED from the CRD by laps_operator.spec.crd: do not edit. Regenerate with `{REGENERATE}`. -->",
        "",
        f"`apiVersion: {GROUP}/{VERSION}`, `kind: {KIND}` (short name `{SHORT_NAMES[0]}`), namespaced; the CRD "
        f"is `{CRD_FILE}`. `metadata.name`: at most {name['maxLength']} characters matching "
        f"{_code(name['pattern'])} (it prefixes the names of the cluster's children).",
        "",
        "The API server applies the defaults below to what a LAPSCluster leaves out and refuses a value "
        "outside its bounds; the operator applies the same defaults and checks, and more (what the API server "
        "would refuse in the children, what the spec may not take back from the operator), as the "
        "`InvalidSpec` condition. Objects that appear more than once (a pool's placement, the gateway's) are "
        "described at their first place.",
        "",
    ]
    spec_ref, status_ref = _Reference(), _Reference()
    spec_ref.walk("spec", spec)
    status_ref.walk("status", status)
    lines += [*spec_ref.sections, "### Rules across fields", "",
              "Checked by the API server (x-kubernetes-validations) and by the operator, with these messages.", "",
              *_rules(spec), ""]
    status_ref.sections[0] = status_ref.sections[0].replace(
        "## status\n", "## status\n\nWritten by the operator, through the status subresource.\n", 1)
    lines += status_ref.sections
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m laps_operator.spec.crd", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--docs", action="store_true", help=f"print {DOCS_FILE} instead of the CRD")
    what.add_argument("--write", action="store_true",
                      help=f"write {CRD_FILE} and {DOCS_FILE} under the current directory (the repository's root)")
    args = parser.parse_args(argv)
    if args.write:
        for path, text in ((Path(CRD_FILE), crd_yaml()), (Path(DOCS_FILE), docs_markdown())):
            if not path.parent.is_dir():
                parser.error(f"{path.parent}/ is not here: run this from the repository's root")
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
        return 0
    sys.stdout.write(docs_markdown() if args.docs else crd_yaml())
    return 0


if __name__ == "__main__":
    sys.exit(main())
