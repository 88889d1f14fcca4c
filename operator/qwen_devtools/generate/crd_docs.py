"""docs/crd-reference.md, generated from the pydantic models that also generate the CRD.

Every field of the spec gets its path, type, default, constraints and description; the status
fields and conditions come from the CRD's status schema and the status module.
"""

from __future__ import annotations

import json
import re
from typing import Any

from qwen_operator import status as status_module
from qwen_operator.api.crd import status_schema
from qwen_operator.api.spec import API_VERSION, KIND, QwenDeploymentSpec

from .header import markdown_comment

_CONSTRAINTS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "minLength": "length >= {}",
    "maxLength": "length <= {}",
    "minItems": "items >= {}",
    "pattern": "matches `{}`",
}


def _deref(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _unwrap_optional(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Optional[X] (anyOf [X, null]) as X, keeping the field's own description and default."""
    members = [m for m in node.get("anyOf", []) if m.get("type") != "null"]
    if len(members) == 1:
        outer = {k: v for k, v in node.items() if k != "anyOf"}
        return {**_deref(members[0], defs), **outer}
    return _deref(node, defs)


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    node = _unwrap_optional(node, defs)
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    if node.get("x-kubernetes-int-or-string"):
        return "quantity"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (Kubernetes)"
    kind = node.get("type")
    if kind == "array":
        return f"list of {_type(node.get('items', {}), defs)}"
    if kind == "object" and "properties" not in node and isinstance(node.get("additionalProperties"), dict):
        return f"map of {_type(node['additionalProperties'], defs)}"
    if "properties" in node:
        return "object"
    if "oneOf" in node:
        return "one of (by `method`)"
    return str(kind or "any")


def _default(node: dict[str, Any], required: bool, defs: dict[str, Any]) -> str:
    if required:
        return "required"
    if "default" in node:
        return "unset" if node["default"] is None else f"`{json.dumps(node['default'])}`"
    resolved = _unwrap_optional(node, defs)
    if resolved.get("type") == "array":
        return "`[]`"
    if "properties" in resolved:
        return "see fields"
    if resolved.get("type") == "object":
        return "`{}`"
    return "unset"


def _constraints(node: dict[str, Any], defs: dict[str, Any]) -> str:
    node = _unwrap_optional(node, defs)
    parts = [fmt.format(node[key]) for key, fmt in _CONSTRAINTS.items() if key in node]
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _sections(
    path: str, node: dict[str, Any], defs: dict[str, Any], out: list[str], title: str | None = None
) -> None:
    """Append a table of `node`'s fields under `path`, then one section per nested object."""
    node = _unwrap_optional(node, defs)
    required = set(node.get("required", []))
    out += ["", f"### `{title or path}`", ""]
    if node.get("description"):
        out += [_cell(node["description"]), ""]
    out += ["| Field | Type | Default | Constraints | Description |", "|---|---|---|---|---|"]
    nested: list[tuple[str, dict[str, Any]]] = []
    for name, prop in node.get("properties", {}).items():
        field_path = f"{path}.{name}"
        row = [
            f"`{field_path}`",
            _type(prop, defs),
            _default(prop, name in required, defs),
            _cell(_constraints(prop, defs)),
            _cell(prop.get("description", "")),
        ]
        out.append("| " + " | ".join(row) + " |")
        resolved = _unwrap_optional(prop, defs)
        if "properties" in resolved or "oneOf" in resolved:
            nested.append((field_path, resolved))
        elif resolved.get("type") == "array":  # a list of the operator's own objects: one item's fields
            items = _unwrap_optional(resolved.get("items", {}), defs)
            if "properties" in items and not items.get("x-kubernetes-preserve-unknown-fields"):
                nested.append((f"{field_path}[]", items))
    for field_path, resolved in nested:
        if "oneOf" in resolved:
            for member in resolved["oneOf"]:
                member = _deref(member, defs)
                method = member["properties"]["method"].get("const")
                _sections(field_path, member, defs, out, f"{field_path} (method: {method})")
        else:
            _sections(field_path, resolved, defs, out)


def _rules(spec: dict[str, Any]) -> list[str]:
    rules = spec.get("x-kubernetes-validations", [])
    if not rules:
        return []
    lines = [
        "",
        "### Rules across fields",
        "",
        "Checked by the API server (CEL) and again by the operator:",
        "",
    ]
    return lines + [f"- {rule['message']} (`{rule['rule']}`)" for rule in rules]


def _condition_meanings(doc: str) -> dict[str, str]:
    """`  Name   meaning` entries of the status module's docstring, with their indented continuation lines."""
    meaning: dict[str, str] = {}
    current = None
    for line in doc.splitlines():
        entry = re.match(r"^\s{2}(\w+)\s+(.+)$", line)
        if entry:
            current = entry.group(1)
            meaning[current] = entry.group(2).strip()
        elif current and re.match(r"^\s{3,}\S", line):
            meaning[current] += " " + line.strip()
        else:
            current = None
    return meaning


def _conditions() -> list[str]:
    meaning = _condition_meanings(status_module.__doc__ or "")
    lines = ["", "### Conditions", "", "| Type | Meaning |", "|---|---|"]
    types = (*status_module.CONDITION_TYPES, *status_module.OPTIONAL_CONDITION_TYPES)
    return lines + [f"| `{t}` | {_cell(meaning.get(t, ''))} |" for t in types]


def _status() -> list[str]:
    lines = [
        "",
        "## Status",
        "",
        "Written by the operator only (status subresource); never part of what you apply.",
        "",
    ]
    lines += ["| Field | Type | Description |", "|---|---|---|"]
    for name, prop in status_schema()["properties"].items():
        kind = "list of conditions" if name == "conditions" else prop.get("type", "any")
        description = prop.get("description", "")
        lines.append(f"| `status.{name}` | {kind} | {_cell(description)} |")
    return lines + _conditions()


def crd_reference() -> str:
    """The whole reference page as Markdown."""
    schema = QwenDeploymentSpec.model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})
    out = [
        f"# {KIND} reference",
        "",
        markdown_comment("the pydantic models"),
        "",
        f"`apiVersion: {API_VERSION}`, `kind: {KIND}` (short name `qwd`). Defaults are applied by the",
        "operator when it reads a resource and are never written back, so what you apply stays as stored.",
        "Unknown fields are rejected. Examples: [examples/](../examples/).",
        "",
        "## Spec",
    ]
    _sections("spec", schema, defs, out)
    out += _rules(schema)
    out += _status()
    return "\n".join(out) + "\n"
