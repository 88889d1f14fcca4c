"""The chart's values.yaml as the one source of its values.schema.json and its README table of values.

Comment grammar above a key in values.yaml:
  `# -- text` (and following `#` lines) describes the key; every key needs one.
  `# @schema {json}` merges JSON Schema keywords into the key's schema; with `type`, `$ref` or
  `additionalProperties` the key is opaque (its children are not described one by one).
  `# @k8s io.k8s.api.core.v1.Affinity` (or `[]Type` for a list) types the key with a Kubernetes
  definition, copied from kubernetes-validate's strict schemas of the pinned Kubernetes version.
Every object the schema describes has `additionalProperties: false`, so a misspelled key fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from qwen_operator.versions import kubernetes_minor

from .header import markdown_comment

#: kubernetes-validate names its schema sets by x.y.0; the pinned Kubernetes minor picks one.
K8S_SCHEMA_VERSION = f"{kubernetes_minor()}.0"
_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*):(?P<rest>.*)$")
_OPAQUE_KEYWORDS = {"type", "$ref", "additionalProperties"}


@dataclass
class ValueDoc:
    """What the comments above one key of values.yaml say."""

    path: tuple[str, ...]
    description: str = ""
    schema: dict[str, Any] = field(default_factory=dict)
    k8s: str | None = None

    @property
    def opaque(self) -> bool:
        return self.k8s is not None or bool(_OPAQUE_KEYWORDS & set(self.schema))


class ValuesError(ValueError):
    """values.yaml breaks the comment grammar (undocumented key, bad annotation)."""


def parse_comments(text: str) -> dict[tuple[str, ...], ValueDoc]:
    """Map every key path of values.yaml (block style) to the comments right above it."""
    docs: dict[tuple[str, ...], ValueDoc] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip() if not stripped.startswith("# ") else stripped[2:])
            continue
        match = _KEY_LINE.match(line)
        if not stripped or not match:
            pending = [] if not stripped else pending
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(key for _, key in stack), match["key"])
        stack.append((indent, match["key"]))
        docs[path] = _doc(path, pending, number)
        pending = []
    return docs


def _doc(path: tuple[str, ...], comment: list[str], line: int) -> ValueDoc:
    doc = ValueDoc(path)
    text: list[str] = []
    in_description = False
    for entry in comment:
        if entry.startswith("@schema "):
            try:
                doc.schema.update(json.loads(entry.removeprefix("@schema ")))
            except json.JSONDecodeError as exc:
                raise ValuesError(f"values.yaml:{line}: bad @schema JSON: {exc}") from None
        elif entry.startswith("@k8s "):
            doc.k8s = entry.removeprefix("@k8s ").strip()
        elif entry.startswith("-- "):
            in_description = True
            text = [entry[3:]]
        elif in_description:
            text.append(entry)
    doc.description = " ".join(t for t in text if t).strip()
    return doc


# --- schema ----------------------------------------------------------------------------------------


def _scalar_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    raise ValuesError(f"cannot infer a schema type for {value!r}")


def _node_schema(
    path: tuple[str, ...], value: Any, docs: dict[tuple[str, ...], ValueDoc], refs: set[str]
) -> dict[str, Any]:
    doc = docs.get(path)
    if doc is None or not doc.description:
        raise ValuesError(f"values.yaml: key {'.'.join(path)} has no `# --` description")
    schema: dict[str, Any] = {"description": doc.description}
    if doc.k8s:
        name = doc.k8s.removeprefix("[]")
        refs.add(name)
        ref = {"$ref": f"#/$defs/{name}"}
        schema |= {"type": "array", "items": ref} if doc.k8s.startswith("[]") else ref
    elif isinstance(value, dict) and not doc.opaque:
        if not value:
            raise ValuesError(f"values.yaml: empty map {'.'.join(path)} needs @schema or @k8s")
        props = {k: _node_schema((*path, k), v, docs, refs) for k, v in value.items()}
        schema |= {"type": "object", "additionalProperties": False, "properties": props}
    elif isinstance(value, list) and not doc.opaque:
        raise ValuesError(f"values.yaml: list {'.'.join(path)} needs @schema or @k8s")
    elif not doc.opaque:
        schema["type"] = _scalar_type(value)
    return schema | doc.schema


@cache  # one large JSON file, read once for the schema and once more for the README
def _k8s_definitions() -> dict[str, Any]:
    base = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    path = base / f"v{K8S_SCHEMA_VERSION}-local-strict" / "_definitions.json"
    return json.loads(path.read_text())["$defs"]


def _strip(node: Any) -> Any:
    """A Kubernetes definition without descriptions and extensions, refs pointing into this file."""
    if isinstance(node, list):
        return [_strip(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":  # property names are data, not keywords: keep every one
            out[key] = {name: _strip(sub) for name, sub in value.items()}
        elif key == "$ref":
            out[key] = "#/$defs/" + value.rsplit("/", 1)[-1]
        elif key != "description" and not key.startswith("x-kubernetes"):
            out[key] = _strip(value)
    return out


def _closure(names: set[str], defs: dict[str, Any]) -> dict[str, Any]:
    todo, seen = sorted(names), {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in defs:
            raise ValuesError(f"unknown Kubernetes type {name}")
        seen[name] = _strip(defs[name])
        todo += sorted(set(re.findall(r'"#/\$defs/([^"]+)"', json.dumps(seen[name]))) - set(seen))
    return dict(sorted(seen.items()))


def values_schema(values_path: Path) -> dict[str, Any]:
    """The strict JSON Schema of the chart's values."""
    text = values_path.read_text()
    values = yaml.safe_load(text)
    docs = parse_comments(text)
    refs: set[str] = set()
    props = {k: _node_schema((k,), v, docs, refs) for k, v in values.items()}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Values of the qwen-operator chart (generated from values.yaml by `make generate`)",
        "type": "object",
        "additionalProperties": False,
        "properties": props,
        "$defs": _closure(refs, _k8s_definitions()),
    }


# --- README ----------------------------------------------------------------------------------------


def _default(value: Any) -> str:
    if isinstance(value, str):
        return f'`"{value}"`'
    text = json.dumps(value, separators=(", ", ": "))
    return f"`{text}`"


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit(".", 1)[-1]
    if schema.get("type") == "array":
        items = schema.get("items", {})
        return f"list of {_type(items) if items else 'any'}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if schema.get("type") == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "map of string"
    return str(schema.get("type", "any"))


def _rows(path: tuple[str, ...], value: Any, schema: dict[str, Any]) -> list[str]:
    if "properties" in schema and schema.get("type") == "object" and isinstance(value, dict):
        rows = []
        for key, sub in schema["properties"].items():
            rows += _rows((*path, key), value[key], sub)
        return rows
    description = schema["description"].replace("|", "\\|")
    return [f"| `{'.'.join(path)}` | {_type(schema)} | {_default(value)} | {description} |"]


def _table(keys: list[str], values: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    rows = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for key in keys:
        rows += _rows((key,), values[key], schema["properties"][key])
    return rows


def values_readme(chart_dir: Path, schema: dict[str, Any]) -> str:
    """README.md of the chart: how to install, and every value with its type, default and meaning."""
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    values = yaml.safe_load((chart_dir / "values.yaml").read_text())
    lines = [
        f"# {chart['name']}",
        "",
        markdown_comment("values.yaml"),
        "",
        f"{chart['description']}.",
        "",
        f"Chart version {chart['version']}, operator version {chart['appVersion']}.",
        "",
        "```bash",
        f"helm install {chart['name']} charts/{chart['name']} -n qwen-operator-system --create-namespace",
        "```",
        "",
        "`values.schema.json` is strict: an unknown or misspelled key fails `helm install` and",
        "`helm template`. See [docs/install.md](../../docs/install.md) for scenarios (namespaced mode,",
        "image by digest, monitoring) and [docs/monitoring.md](../../docs/monitoring.md) for the",
        "dashboard and alerts.",
        "",
        "## Values",
    ]
    general = [k for k, sub in schema["properties"].items() if "properties" not in sub]
    lines += ["", "### General", "", *_table(general, values, schema)]
    for key, sub in schema["properties"].items():
        if key not in general:
            lines += ["", f"### `{key}`", "", sub["description"], "", *_table([key], values, schema)]
    return "\n".join(lines) + "\n"
