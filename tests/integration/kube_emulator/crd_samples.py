"""A small namespaced CRD with a status subresource, written to a file as users keep theirs."""
from __future__ import annotations

from pathlib import Path

import yaml

GROUP, VERSION, PLURAL, KIND = "test.laps.io", "v1", "widgets", "Widget"
WIDGET = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND}    # what a custom object's body must say
GADGET = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Gadget"}


def widget_crd() -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "widget", "kind": KIND,
                      "shortNames": ["wdg"], "categories": ["laps"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }],
        },
    }


def write_widget_crd(directory: Path) -> Path:
    path = directory / "widgets-crd.yaml"
    path.write_text(yaml.safe_dump(widget_crd()))
    return path


GADGETS = "gadgets"


def write_gadget_crd(directory: Path) -> Path:
    """A CRD with a real structural schema: defaults, constraints, a preserved sub-tree."""
    schema = {
        "type": "object", "required": ["spec"],
        "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1},
                "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"},
                "port": {"x-kubernetes-int-or-string": True},
                "tuning": {"type": "object", "default": {},
                           "properties": {"window": {"type": "number", "default": 5.0}}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            }},
            "status": {"type": "object", "properties": {
                "phase": {"type": "string"},
                "pressure": {"type": "number", "nullable": True}}},
        },
    }
    crd = widget_crd()
    crd["metadata"]["name"] = f"{GADGETS}.{GROUP}"
    crd["spec"]["names"] = {"plural": GADGETS, "singular": "gadget", "kind": "Gadget"}
    crd["spec"]["versions"][0]["schema"] = {"openAPIV3Schema": schema}
    path = directory / "gadgets-crd.yaml"
    path.write_text(yaml.safe_dump(crd))
    return path
