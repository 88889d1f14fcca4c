"""The chart's RBAC rules for the operator's child kinds, from the one list of them (`kinds.MANAGED`).

`make generate` writes them as the named template `qwen-operator.managedKindRules`
(templates/_managed-kinds.tpl), which `qwen-operator.namespacedRules` in _helpers.tpl includes next to
the rules that are not child kinds (the QwenDeployments, their status, pods, events). A kind added to
MANAGED is thereby granted in the ClusterRole and in every per-namespace Role.
"""

from __future__ import annotations

import json
from collections import defaultdict

from qwen_operator.kinds import MANAGED, Kind

from .header import notice

TEMPLATE = "charts/qwen-operator/templates/_managed-kinds.tpl"
NAME = "qwen-operator.managedKindRules"
#: The operator creates, server-side applies (patch), prunes (delete) and watches every child.
VERBS = ("get", "list", "watch", "create", "patch", "update", "delete")


def managed_kind_rules(kinds: tuple[Kind, ...] = MANAGED) -> list[tuple[str, list[str]]]:
    """(API group, its resources) per group, groups and resources sorted."""
    resources: dict[str, set[str]] = defaultdict(set)
    for kind in kinds:
        resources[kind.group].add(kind.plural)
    return [(group, sorted(plurals)) for group, plurals in sorted(resources.items())]


def managed_kinds_template() -> str:
    """_managed-kinds.tpl: one rule per API group, in the list style of _helpers.tpl."""
    lines = [
        f"{{{{/* {notice('operator/qwen_operator/kinds.py (MANAGED)')} */}}}}",
        "",
        "{{/* Every kind the operator creates and owns; included by qwen-operator.namespacedRules. */}}",
        f'{{{{- define "{NAME}" -}}}}',
    ]
    for group, plurals in managed_kind_rules():
        lines += [
            f"- apiGroups: {json.dumps([group])}",
            f"  resources: {json.dumps(plurals)}",
            f"  verbs: {json.dumps(list(VERBS))}",
        ]
    return "\n".join([*lines, "{{- end }}"]) + "\n"
