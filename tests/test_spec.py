"""The pydantic models of QwenDeployment: camelCase only, unknown fields refused, errors name full paths."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, get_args

import pytest
from pydantic import ValidationError

from qwen_operator.api import quantity
from qwen_operator.api import spec as api
from qwen_operator.api.catalog import GIB, GPUS, MIB
from qwen_operator.api.crd import crd
from qwen_operator.api.review import review
from qwen_operator.api.spec import SpecError, field_path, parse
from qwen_operator.manifests import build_children
from support import EXAMPLES, GOLDEN, example, load


def problems(body: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        parse(body)
    return caught.value.problems


def with_spec(**changes: Any) -> dict[str, Any]:
    """The A100 example with top-level spec keys replaced (None removes one)."""
    body = example("a100-80gb-tp2-bf16")
    for key, value in changes.items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = value
    return body


def with_engine(**engine: Any) -> dict[str, Any]:
    return with_spec(engine=engine)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_parse(path: Any) -> None:
    resource = parse(load(path))
    assert resource.metadata.namespace == "llm"
    assert resource.spec.model.name.startswith("Qwen/Qwen3-32B")


def test_defaults_are_applied_when_parsing() -> None:
    spec = parse(with_spec(engine=None, replicas=None, gateway=None)).spec
    assert spec.engine.max_model_len == 32_768
    assert spec.engine.gpu_memory_utilization == 0.9
    assert spec.engine.enable_chunked_prefill and spec.engine.enable_prefix_caching
    assert spec.engine.reasoning.enabled and spec.engine.reasoning.parser == "qwen3"
    assert spec.engine.tool_calling.parser == "hermes"
    assert spec.effective_replicas == 1
    assert spec.gpu.gpus_per_node == 8


# --- camelCase only --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "snake", "path"),
    [
        ("engine", {"max_model_len": 16_384}, "spec.engine.max_model_len"),
        ("engine", {"gpu_memory_utilization": 0.8}, "spec.engine.gpu_memory_utilization"),
        ("gpu", {"type": "A100-80GB", "gpus_per_node": 4}, "spec.gpu.gpus_per_node"),
        ("model", {"name": "Qwen/Qwen3-32B", "served_model_name": "qwen"}, "spec.model.served_model_name"),
    ],
)
def test_snake_case_is_an_unknown_field(section: str, snake: dict[str, Any], path: str) -> None:
    # The CRD has only camelCase properties: accepting snake_case here would let the operator read a
    # value the API server prunes or refuses.
    assert (path, "unknown field") in problems(with_spec(**{section: snake}))


def test_python_names_are_not_accepted_either() -> None:
    with pytest.raises(ValidationError):
        api.Engine.model_validate({"max_model_len": 1024})
    assert api.Engine.model_validate({"maxModelLen": 1024}).max_model_len == 1024


def test_every_crd_property_is_camel_case() -> None:
    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for name, child in (node.get("properties") or {}).items():
                assert "_" not in name, f"{path}.{name}"
                walk(child, f"{path}.{name}")
            walk(node.get("items"), f"{path}[]")

    walk(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec")


def test_every_required_crd_property_is_in_the_schema() -> None:
    """A field named like a schema keyword (an alias's `default`) is a property all the same: dropped,
    the API server refused every alias as an unknown field (found by e2e/test_crd.py)."""

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            missing = set(node.get("required") or []) - set(node.get("properties") or {})
            assert not missing, f"{path}: required but not in properties: {sorted(missing)}"
            for name, child in (node.get("properties") or {}).items():
                walk(child, f"{path}.{name}")
            walk(node.get("items"), f"{path}[]")

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    walk(spec, "spec")
    alias = spec["properties"]["gateway"]["properties"]["aliases"]["items"]
    assert alias["properties"]["default"]["type"] == "string"


# --- unknown fields, with the full path ------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"replica": 2}, "spec.replica"),
        ({"engine": {"maxModelLength": 1}}, "spec.engine.maxModelLength"),
        ({"engine": {"speculative": {"method": "ngram", "foo": 1}}}, "spec.engine.speculative.foo"),
        ({"engine": {"speculative": {"method": "eagle3", "model": "m", "promptLookupMax": 3}}},
         "spec.engine.speculative.promptLookupMax"),
        ({"engine": {"reasoning": {"parserName": "qwen3"}}}, "spec.engine.reasoning.parserName"),
        ({"gateway": {"rateLimit": {"requestsPerMinut": 60}}}, "spec.gateway.rateLimit.requestsPerMinut"),
        ({"model": {"name": "Qwen/Qwen3-32B", "cache": {"claim": "x"}}}, "spec.model.cache.claim"),
        ({"replicas": None, "autoscaling": {"maxReplicas": 2, "behavior": {"up": 1}}},
         "spec.autoscaling.behavior.up"),
    ],
)  # fmt: skip
def test_unknown_fields_are_refused_with_their_path(changes: dict[str, Any], path: str) -> None:
    assert (path, "unknown field") in problems(with_spec(**changes))


def test_ngram_with_a_model_is_an_unknown_field() -> None:
    found = problems(with_engine(speculative={"method": "ngram", "model": "Qwen/Qwen3-0.6B"}))
    assert found == [("spec.engine.speculative.model", "unknown field")]


def test_all_problems_are_reported_at_once() -> None:
    body = with_spec(replica=1, engine={"maxNumSeqs": 0, "foo": True})
    assert {p for p, _ in problems(body)} == {"spec.replica", "spec.engine.maxNumSeqs", "spec.engine.foo"}


# --- list items and union members ------------------------------------------------------------------


def test_list_item_paths() -> None:
    found = problems(with_engine(extraArgs=["--enforce-eager", "--seed", 3, None]))
    assert found == [
        ("spec.engine.extraArgs[2]", "Input should be a valid string"),
        ("spec.engine.extraArgs[3]", "Input should be a valid string"),
    ]


def test_nested_list_item_paths() -> None:
    gpu = {"type": "A100-80GB", "tolerations": [{"key": "a"}, "not-an-object"]}
    assert problems(with_spec(gpu=gpu)) == [("spec.gpu.tolerations[1]", "Input should be a valid dictionary")]
    route = {"parentRefs": [{"name": "gw"}], "hostnames": ["a", 7]}
    assert problems(with_spec(gateway={"httpRoute": route})) == [
        ("spec.gateway.httpRoute.hostnames[1]", "Input should be a valid string")
    ]


def test_speculative_member_fields_have_no_tag_in_the_path() -> None:
    found = problems(with_engine(speculative={"method": "draft_model", "numSpeculativeTokens": 0}))
    assert ("spec.engine.speculative.model", "required field is missing") in found
    assert (
        "spec.engine.speculative.numSpeculativeTokens",
        "Input should be greater than or equal to 1",
    ) in found


def test_speculative_method_errors_name_the_method_field() -> None:
    (bad,) = problems(with_engine(speculative={"method": "medusa"}))
    assert bad == (
        "spec.engine.speculative.method",
        "must be one of 'ngram', 'draft_model', 'eagle3', not 'medusa'",
    )
    assert problems(with_engine(speculative={"numSpeculativeTokens": 2})) == [
        ("spec.engine.speculative.method", "required field is missing")
    ]


def test_union_tag_names_elsewhere_are_kept_in_paths() -> None:
    # "ngram" is a union tag below `speculative` only; as a map key elsewhere it is part of the path.
    gpu = {"type": "A100-80GB", "nodeSelector": {"ngram": 3}}
    assert problems(with_spec(gpu=gpu)) == [("spec.gpu.nodeSelector.ngram", "Input should be a valid string")]


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("spec", "engine", "extraArgs", 2), "spec.engine.extraArgs[2]"),
        (
            ("spec", "engine", "speculative", "ngram", "promptLookupMin"),
            "spec.engine.speculative.promptLookupMin",
        ),
        (("spec", "gpu", "tolerations", 0, "key"), "spec.gpu.tolerations[0].key"),
        (("spec", "autoscaling", "function-after[_bounds(), Autoscaling]"), "spec.autoscaling"),
        ((), ""),
    ],
)
def test_field_path(loc: tuple[int | str, ...], path: str) -> None:
    assert field_path(loc) == path


# --- cross-field rules name the field --------------------------------------------------------------


def test_replicas_and_autoscaling_together() -> None:
    found = problems(with_spec(replicas=2, autoscaling={"maxReplicas": 4}))
    assert found == [("spec.replicas", "set either replicas or autoscaling, not both")]


def test_autoscaling_min_over_max() -> None:
    found = problems(with_spec(replicas=None, autoscaling={"minReplicas": 5, "maxReplicas": 2}))
    assert found == [("spec.autoscaling.minReplicas", "5 exceeds maxReplicas (2)")]


def test_keda_needs_prometheus_address() -> None:
    found = problems(with_spec(replicas=None, autoscaling={"maxReplicas": 2, "driver": "keda"}))
    assert found == [
        ("spec.autoscaling.prometheusAddress", "driver keda needs prometheusAddress (the Prometheus URL)")
    ]
    keda = {"maxReplicas": 2, "driver": "keda", "prometheusAddress": "http://prometheus:9090"}
    assert parse(with_spec(replicas=None, autoscaling=keda)).spec.autoscaling is not None


def test_prompt_lookup_min_over_max() -> None:
    speculative = {"method": "ngram", "promptLookupMin": 5, "promptLookupMax": 3}
    assert problems(with_engine(speculative=speculative)) == [
        ("spec.engine.speculative.promptLookupMin", "5 exceeds promptLookupMax (3)")
    ]
    # the defaults (min 2, max 4) take part: min 5 alone is over the default max
    assert problems(with_engine(speculative={"method": "ngram", "promptLookupMin": 5}))[0][0] == (
        "spec.engine.speculative.promptLookupMin"
    )


# --- scalar checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "path", "message"),
    [
        ({"replicas": -1}, "spec.replicas", "Input should be greater than or equal to 0"),
        ({"engine": {"maxNumSeqs": -8}}, "spec.engine.maxNumSeqs",
         "Input should be greater than or equal to 1"),
        ({"engine": {"gpuMemoryUtilization": 1.5}}, "spec.engine.gpuMemoryUtilization",
         "Input should be less than or equal to 0.98"),
        ({"engine": {"gpuMemoryUtilization": 0.1}}, "spec.engine.gpuMemoryUtilization",
         "Input should be greater than 0.1"),
        ({"engine": {"kvCacheDtype": "fp16"}}, "spec.engine.kvCacheDtype", "Input should be 'auto' or 'fp8'"),
        ({"gpu": {"type": "H100"}}, "spec.gpu.type", "Input should be 'A10-24GB'"),
        ({"parallelism": {"tensor": 0}}, "spec.parallelism.tensor",
         "Input should be greater than or equal to 1"),
        ({"engine": {"resources": {"memory": "64 GB"}}}, "spec.engine.resources.memory",
         "String should match pattern"),
        ({"model": None}, "spec.model", "required field is missing"),
        ({"model": {"name": ""}}, "spec.model.name", "String should have at least 1 character"),
    ],
)  # fmt: skip
def test_scalar_problems(changes: dict[str, Any], path: str, message: str) -> None:
    found = dict(problems(with_spec(**changes)))
    assert message in found[path]


@pytest.mark.parametrize(("given", "parsed"), [(8, "8"), (0.5, "0.5"), ("500m", "500m"), ("64Gi", "64Gi")])
def test_quantities_are_int_or_string_as_in_kubernetes(given: object, parsed: str) -> None:
    # `cpu: 8` is what people write; the CRD declares x-kubernetes-int-or-string, so the API server stores it
    spec = parse(with_engine(resources={"cpu": given, "shmSize": given})).spec
    assert spec.engine.resources.cpu == parsed == spec.engine.resources.shm_size


@pytest.mark.parametrize("given", [-1, True, "8 cores", "64 GB"])
def test_bad_quantities(given: object) -> None:
    assert problems(with_engine(resources={"cpu": given}))[0][0] == "spec.engine.resources.cpu"


@pytest.mark.parametrize("name", ["Chat_A100", "chat.v2", "1chat", "chat-", "-chat"])
def test_metadata_name_must_be_a_dns_1035_label(name: str) -> None:
    body = example("a100-80gb-tp2-bf16")
    body["metadata"]["name"] = name
    assert problems(body) == [("metadata.name", api.NAME_RULES[1].message)]


def test_metadata_name_at_most_the_limit() -> None:
    body = example("a100-80gb-tp2-bf16")
    body["metadata"]["name"] = "a" * api.MAX_NAME_LENGTH
    assert parse(body).metadata.name == "a" * api.MAX_NAME_LENGTH
    body["metadata"]["name"] = "a" * (api.MAX_NAME_LENGTH + 1)
    assert problems(body) == [("metadata.name", api.NAME_RULES[0].message)]
    assert f"at most {api.MAX_NAME_LENGTH} characters" in api.NAME_RULES[0].message


def _label_bound_names(objects: list[dict[str, Any]]) -> dict[str, str]:
    """What must be a DNS label of at most 63 characters -> where it comes from: Service names, label
    values, and the pods of each Deployment, named `<deployment>-<pod-template-hash>-<random>`."""
    found: dict[str, str] = {}

    def labels(where: str, values: dict[str, str]) -> None:
        for key, value in values.items():
            found[value] = f"{where} label {key}"

    for obj in objects:
        meta, kind = obj["metadata"], obj["kind"]
        labels(f"{kind} {meta['name']}", meta.get("labels", {}))
        if kind == "Service":
            found[meta["name"]] = "Service name"
        if kind == "Deployment":
            pod = f"{meta['name']}-{'h' * 10}-{'r' * 5}"
            assert len(pod) == len(meta["name"]) + api.POD_NAME_SUFFIX
            found[pod] = f"pod of Deployment {meta['name']}"
            labels(f"pods of {meta['name']}", obj["spec"]["template"]["metadata"]["labels"])
    return found


def test_the_longest_child_name_is_exactly_at_the_dns_label_limit() -> None:
    # Every child of a deployment that has them all, named as long as allowed: no name bound to 63
    # characters is longer, and one reaches 63 exactly (so the limit is not lower than it must be).
    body = load(GOLDEN / "inputs" / "everything.yaml")
    body["metadata"]["name"] = "a" * api.MAX_NAME_LENGTH
    objects = build_children(review(body)).objects
    assert {"Service", "Deployment", "ScaledObject", "Ingress", "HTTPRoute"} <= {o["kind"] for o in objects}
    bound = _label_bound_names(objects)
    longest = max(bound, key=len)
    assert len(longest) == 63, (longest, bound[longest])
    assert bound[longest] == f"pod of Deployment {'a' * api.MAX_NAME_LENGTH}-gateway"
    assert all(len(o["metadata"]["name"]) <= 253 for o in objects)  # the other kinds: DNS subdomains


def test_operator_env_is_what_the_engine_container_gets() -> None:
    # The names refused in engine.env are exactly those the engine builder sets (all of them appear in
    # the golden input that turns on offline, hfTokenSecret and apiKeySecret).
    body = load(GOLDEN / "inputs" / "everything.yaml")
    rev = review(body)
    engine = next(o for o in build_children(rev).objects if o["metadata"]["name"] == "everything-engine"
                  and o["kind"] == "Deployment")  # fmt: skip
    env = [e["name"] for e in engine["spec"]["template"]["spec"]["containers"][0]["env"]]
    own = [e["name"] for e in body["spec"]["engine"]["env"]]
    assert sorted(name for name in env if name not in own) == sorted(api.OPERATOR_ENV)


@pytest.mark.parametrize("name", sorted(api.OPERATOR_ENV))
def test_engine_env_may_not_set_what_the_operator_sets(name: str) -> None:
    found = problems(with_engine(env=[{"name": "A", "value": "1"}, {"name": name, "value": "x"}]))
    assert found == [("spec.engine.env[1].name", found[0][1])]
    assert found[0][1].startswith(f"{name} is set by the operator")
    field = api.OPERATOR_ENV[name]
    assert (field is None) or f"from {field}; use that field" in found[0][1]


def test_engine_env_entries_need_a_name() -> None:
    assert problems(with_engine(env=[{"value": "x"}])) == [
        ("spec.engine.env[0].name", "required field is missing (the variable's name)")
    ]


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai:v0.32.0",
        "registry.example:5000/team/vllm:v0.32.0-cu128",
        "vllm/vllm-openai@sha256:" + "a" * 64,
        "vllm/vllm-openai:latest@sha256:" + "b" * 64,  # the digest pins it
    ],
)
def test_pinned_images_are_accepted(image: str) -> None:
    spec = parse(with_spec(engine={"image": image}, gateway={"image": image})).spec
    assert spec.engine.image == image == spec.gateway.image


@pytest.mark.parametrize(
    ("image", "rule"),
    [
        ("vllm/vllm-openai", 0),
        ("registry.example:5000/vllm", 0),  # the registry's port is not a tag
        ("vllm/vllm-openai@sha256:abc", 0),
        ("vllm/vllm-openai:latest", 1),
    ],
)
def test_unpinned_images_are_refused(image: str, rule: int) -> None:
    message = api.IMAGE_RULES[rule].message
    assert problems(with_engine(image=image)) == [("spec.engine.image", message)]
    assert problems(with_spec(gateway={"image": image})) == [("spec.gateway.image", message)]


def test_image_rules_are_in_the_crd_for_both_images() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    engine_rules = spec["properties"]["engine"]["properties"]["image"]["x-kubernetes-validations"]
    assert [r["message"] for r in engine_rules] == [r.message for r in api.IMAGE_RULES]
    gateway_rules = spec["properties"]["gateway"]["properties"]["image"]["x-kubernetes-validations"]
    assert [r["message"] for r in gateway_rules] == [r.message for r in api.IMAGE_RULES]


def test_the_crd_restricts_metadata_name_by_the_same_rules() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"]
    rules = schema["properties"]["name"]["x-kubernetes-validations"]
    assert rules == [{"rule": r.cel(), "message": r.message} for r in api.NAME_RULES]


def test_offline_needs_a_cache_claim() -> None:
    found = problems(with_spec(model={"name": "Qwen/Qwen3-32B", "offline": True}))
    assert [p for p, _ in found] == ["spec.model.offline"]
    assert "spec.model.cache.claimName" in found[0][1]
    model = {"name": "Qwen/Qwen3-32B", "offline": True, "cache": {"claimName": "weights"}}
    assert parse(with_spec(model=model)).spec.model.offline


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("http://prometheus-operated.monitoring.svc:9090", True),
        ("https://prom.example", True),
        ("prometheus-operated.monitoring:9090", False),
        ("http://", False),
    ],
)
def test_prometheus_address_is_a_url(address: str, ok: bool) -> None:
    keda = {"maxReplicas": 2, "driver": "keda", "prometheusAddress": address}
    body = with_spec(replicas=None, autoscaling=keda)
    if ok:
        assert parse(body).spec.autoscaling is not None
    else:
        assert problems(body) == [("spec.autoscaling.prometheusAddress", api.PROMETHEUS_URL_RULES[0].message)]


@pytest.mark.parametrize(
    ("rule", "value", "broken", "cel"),
    [
        (api.StringRule("^a", "m"), "abc", False, "self.matches('^a')"),
        (api.StringRule("^a", "m"), "cba", True, "self.matches('^a')"),
        (api.StringRule("b$", "m", must_match=False), "cab", True, "!self.matches('b$')"),
        (api.StringRule("b$", "m", must_match=False), "cba", False, "!self.matches('b$')"),
    ],
)
def test_a_string_rule_is_searched_and_may_be_negated(
    rule: api.StringRule, value: str, broken: bool, cel: str
) -> None:
    assert rule.broken_by(value) is broken
    assert rule.cel() == cel


@pytest.mark.parametrize("rule", [*api.IMAGE_RULES, *api.NAME_RULES, *api.PROMETHEUS_URL_RULES])
def test_string_rules_fit_in_a_cel_string_literal(rule: api.StringRule) -> None:
    # The pattern goes into '...' verbatim: a quote would end it, a backslash would need doubling.
    assert "'" not in rule.pattern and "\\" not in rule.pattern


def test_wrong_api_version_or_kind() -> None:
    body = example("a100-80gb-tp2-bf16") | {"apiVersion": "inference.qwenops.dev/v1"}
    assert problems(body)[0][0] == "apiVersion"
    assert problems(example("a100-80gb-tp2-bf16") | {"kind": "Deployment"})[0][0] == "kind"


def test_spec_error_text_lists_every_problem() -> None:
    error = SpecError([("spec.a", "one"), ("spec.b", "two")])
    assert str(error) == "spec.a: one; spec.b: two"


# --- GPU catalog, declared GPUs, community checkpoints ---------------------------------------------


def test_gpu_type_enum_is_the_catalog_plus_custom() -> None:
    assert list(get_args(api.GpuType)) == [*GPUS, "Custom"]


def test_catalog_memory_is_what_cuda_reports() -> None:
    # The CUDA runtime's total, below nvidia-smi's (A100-80GB 81,920 MiB = 80 GiB there): public
    # PyTorch out-of-memory messages give 79.14-79.25 GiB; the H200 was measured at 143,156 MiB.
    assert 79.1 * GIB <= GPUS["A100-80GB"].memory_bytes <= 79.25 * GIB
    assert GPUS["H200-141GB"].memory_bytes == 143_156 * MIB
    for gpu in GPUS.values():
        assert gpu.product_labels and all(label.startswith("NVIDIA-") for label in gpu.product_labels)
        assert gpu.fp8_compute == (gpu.compute_capability >= (8, 9))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("19.5G", 19_500_000_000), ("94Gi", 94 * 1024**3), ("1000", 1000), ("512Mi", 512 * 1024**2)],
)
def test_quantity_bytes(text: str, expected: int) -> None:
    assert quantity.quantity_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1500m", "1.5"), ("2", "2"), ("3k", "3000"), ("1e3", "1000"), ("250u", "0.00025"), ("1Ki", "1024")],
)
def test_a_quantity_the_api_server_writes_has_its_exact_value(text: str, expected: str) -> None:
    """status reads the HPA's current values with the same parser (its exponent form included)."""
    assert quantity.value(text) == Decimal(expected)


_A6000 = {
    "name": "RTX-A6000",
    "memory": "47.4Gi",
    "computeCapability": "8.6",
    "productLabels": ["NVIDIA-RTX-A6000"],
}


def test_a_declared_gpu_parses_and_defaults_fp8_from_the_capability() -> None:
    spec = parse(with_spec(gpu={"type": "Custom", "custom": _A6000})).spec
    info = spec.gpu.info()
    assert (info.type, info.compute_capability, info.architecture) == ("RTX-A6000", (8, 6), "Ampere")
    assert not info.fp8_compute and info.product_labels == ("NVIDIA-RTX-A6000",)


def test_type_custom_needs_custom() -> None:
    assert problems(with_spec(gpu={"type": "Custom"})) == [
        ("spec.gpu.custom", "type Custom needs custom (memory, computeCapability, productLabels)")
    ]


def test_custom_needs_type_custom() -> None:
    assert problems(with_spec(gpu={"type": "A100-80GB", "custom": _A6000})) == [
        ("spec.gpu.custom", "A100-80GB is in the catalog; custom needs type Custom")
    ]


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"computeCapability": "9"}, "spec.gpu.custom.computeCapability"),
        ({"memory": "lots"}, "spec.gpu.custom.memory"),
        ({"productLabels": []}, "spec.gpu.custom.productLabels"),
    ],
)
def test_bad_declared_gpu_fields(changes: dict[str, Any], path: str) -> None:
    assert [p for p, _ in problems(with_spec(gpu={"type": "Custom", "custom": _A6000 | changes}))] == [path]


def test_the_crd_ties_custom_to_type_custom() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    gpu = schema["properties"]["spec"]["properties"]["gpu"]
    assert gpu["x-kubernetes-validations"][0]["rule"] == "(self.type == 'Custom') == has(self.custom)"
    assert "Custom" in gpu["properties"]["type"]["enum"]


def test_a_community_checkpoint_parses() -> None:
    model = {
        "name": "someone/Qwen3-32B-GPTQ-Int4",
        "checkpoint": {"quantization": "gptq", "weightSize": "19.5G"},
    }
    spec = parse(with_spec(model=model)).spec
    assert spec.model.checkpoint is not None and spec.model.checkpoint.weight_bytes == 19_500_000_000


@pytest.mark.parametrize(
    ("checkpoint", "path"),
    [
        ({"quantization": "int4", "weightSize": "19G"}, "spec.model.checkpoint.quantization"),
        ({"quantization": "gptq"}, "spec.model.checkpoint.weightSize"),
    ],
)
def test_bad_community_checkpoints(checkpoint: dict[str, Any], path: str) -> None:
    model = {"name": "someone/Qwen3-32B-GPTQ-Int4", "checkpoint": checkpoint}
    assert [p for p, _ in problems(with_spec(model=model))] == [path]


@pytest.mark.parametrize("method", ["fp8_per_tensor", "fp8_per_block"])
def test_online_fp8_methods_are_accepted(method: str) -> None:
    assert parse(with_engine(quantization=method)).spec.engine.quantization == method


def test_request_timeout_is_unset_by_default() -> None:
    # The default is derived from maxModelLen in the plan (plan.request_timeout_seconds).
    assert parse(with_spec(gateway=None)).spec.gateway.request_timeout_seconds is None


# --- LoRA adapters ---------------------------------------------------------------------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HF_SOURCE = {"huggingFace": {"repo": "my-org/qwen3-32b-sql-lora", "revision": COMMIT}}


def with_lora(lora: dict[str, Any], **model: Any) -> dict[str, Any]:
    body = with_spec(lora=lora)
    body["spec"]["model"] |= model
    return body


def adapter(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "source": HF_SOURCE} | fields


def test_lora_defaults_are_vllms() -> None:
    spec = parse(with_lora({})).spec
    assert spec.lora is not None
    assert (spec.lora.max_loras, spec.lora.max_lora_rank, spec.lora.max_cpu_loras) == (1, 16, None)
    assert spec.lora.effective_max_cpu_loras == 1 and spec.lora.adapters == []
    assert parse(with_spec()).spec.lora is None


def test_lora_adapters_parse() -> None:
    lora = {
        "maxLoras": 2,
        "maxLoraRank": 64,
        "maxCpuLoras": 4,
        "adapters": [adapter("sql", rank=64), {"name": "support-v2", "source": {"path": "loras/support"}}],
    }
    spec = parse(with_lora(lora, cache={"claimName": "weights"})).spec
    assert spec.lora is not None
    sql, support = spec.lora.adapters
    assert sql.source.hugging_face is not None and sql.source.hugging_face.revision == COMMIT
    assert sql.rank == 64 and support.source.path == "loras/support" and support.rank is None


@pytest.mark.parametrize(
    ("lora", "path", "message"),
    [
        ({"adapters": [adapter("sql"), adapter("chat"), adapter("sql")]}, "spec.lora.adapters[2].name",
         "'sql' is also the name of adapters[0]; a request names its adapter, so names must be unique"),
        ({"adapters": [adapter("Sql")]}, "spec.lora.adapters[0].name", api.ADAPTER_NAME_RULES[0].message),
        ({"adapters": [adapter("sql.v2")]}, "spec.lora.adapters[0].name", api.ADAPTER_NAME_RULES[0].message),
        ({"adapters": [adapter("sql-")]}, "spec.lora.adapters[0].name", api.ADAPTER_NAME_RULES[0].message),
        ({"adapters": [adapter("a" * 64)]}, "spec.lora.adapters[0].name",
         "String should have at most 63 characters"),
        ({"adapters": [adapter("sql", rank=32)]}, "spec.lora.adapters[0].rank",
         "32 exceeds maxLoraRank (16): vLLM refuses to load an adapter of a higher rank than its slots; "
         "raise maxLoraRank to 32"),
        ({"maxLoraRank": 64, "adapters": [adapter("sql", rank=100)]}, "spec.lora.adapters[0].rank",
         "100 exceeds maxLoraRank (64): vLLM refuses to load an adapter of a higher rank than its slots; "
         "raise maxLoraRank to 128"),
        ({"maxLoraRank": 48}, "spec.lora.maxLoraRank",
         "Input should be 1, 8, 16, 32, 64, 128, 256, 320 or 512"),
        ({"maxLoras": 0}, "spec.lora.maxLoras", "Input should be greater than or equal to 1"),
        ({"maxLoras": 4, "maxCpuLoras": 3}, "spec.lora.maxCpuLoras",
         "3 is below maxLoras (4): every adapter in a GPU slot is also held in the CPU cache, and vLLM "
         "refuses fewer"),
        ({"adapters": [{"name": "sql", "source": {}}]}, "spec.lora.adapters[0].source.huggingFace",
         "set exactly one of huggingFace or path"),
        ({"adapters": [{"name": "sql", "source": HF_SOURCE | {"path": "loras/sql"}}]},
         "spec.lora.adapters[0].source.path", "set exactly one of huggingFace or path"),
        ({"adapters": [{"name": "sql"}]}, "spec.lora.adapters[0].source", "required field is missing"),
        ({"adapters": [adapter("sql", source={"huggingFace": {"repo": "sql-lora", "revision": COMMIT}})]},
         "spec.lora.adapters[0].source.huggingFace.repo", api.HF_REPO_RULES[0].message),
        ({"adapters": [adapter("sql", source={"huggingFace": {"repo": "o/r", "revision": "main"}})]},
         "spec.lora.adapters[0].source.huggingFace.revision", api.COMMIT_RULES[0].message),
        ({"adapters": [adapter("sql", source={"huggingFace": {"repo": "o/r", "revision": COMMIT.upper()}})]},
         "spec.lora.adapters[0].source.huggingFace.revision", api.COMMIT_RULES[0].message),
        ({"adapters": [adapter("sql", source={"path": "/etc/loras"})]}, "spec.lora.adapters[0].source.path",
         api.CACHE_PATH_RULES[1].message),
        ({"adapters": [adapter("sql", source={"path": "loras/../../etc"})]},
         "spec.lora.adapters[0].source.path", api.CACHE_PATH_RULES[2].message),
        ({"adapters": [adapter("sql", source={"path": "loras/sql expert"})]},
         "spec.lora.adapters[0].source.path", api.CACHE_PATH_RULES[0].message),
        ({"max_loras": 2}, "spec.lora.max_loras", "unknown field"),
    ],
)  # fmt: skip
def test_bad_lora_settings_name_their_field(lora: dict[str, Any], path: str, message: str) -> None:
    assert problems(with_lora(lora, cache={"claimName": "weights"})) == [(path, message)]


def test_dots_in_a_cache_path_are_fine_outside_a_dot_dot_segment() -> None:
    lora = {"adapters": [adapter("sql", source={"path": "loras/sql..v2/.cache/x.y"})]}
    assert parse(with_lora(lora, cache={"claimName": "weights"})).spec.lora is not None


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ({"servedModelName": "qwen3"}, "qwen3"),
        ({"name": "qwen3-32b", "checkpoint": {"quantization": "bf16", "weightSize": "65G"}}, "qwen3-32b"),
    ],
)
def test_an_adapter_may_not_shadow_the_served_model_name(model: dict[str, Any], name: str) -> None:
    found = problems(with_lora({"adapters": [adapter("sql"), adapter(name)]}, **model))
    assert found == [(
        "spec.lora.adapters[1].name",
        f"'{name}' is the base model's served name (spec.model.servedModelName, else spec.model.name): "
        "requests for it would reach the base model, and vLLM refuses to load an adapter of that name; "
        "choose another",
    )]  # fmt: skip


def test_the_served_name_decides_not_the_checkpoint_name() -> None:
    body = with_lora({"adapters": [adapter("qwen3-32b")]}, name="qwen3-32b", servedModelName="chat",
                     checkpoint={"quantization": "bf16", "weightSize": "65G"})  # fmt: skip
    assert parse(body).spec.served_model_name == "chat"


def test_an_adapter_in_the_model_cache_needs_a_cache_claim() -> None:
    lora = {"adapters": [adapter("sql"), adapter("support", source={"path": "loras/support"})]}
    found = problems(with_lora(lora))
    assert [p for p, _ in found] == ["spec.lora.adapters[1].source.path"]
    assert found[0][1].startswith("an adapter in the model cache needs spec.model.cache.claimName")
    assert parse(with_lora(lora, cache={"claimName": "weights"})).spec.lora is not None
    assert parse(with_lora({"adapters": [adapter("sql")]})).spec.lora is not None  # Hugging Face: no claim


def _lora_schema() -> dict[str, Any]:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["lora"]  # type: ignore[no-any-return]


def test_the_crd_keys_adapters_by_name_so_the_api_server_refuses_duplicates() -> None:
    adapters = _lora_schema()["properties"]["adapters"]
    assert adapters["x-kubernetes-list-type"] == "map"
    assert adapters["x-kubernetes-list-map-keys"] == ["name"]
    assert "name" in adapters["items"]["required"]  # a list-map key must be required
    assert adapters["maxItems"] == api.MAX_ADAPTERS  # bounds the cost of the rules that walk the list


def test_the_crd_checks_the_lora_rules_with_cel() -> None:
    lora = _lora_schema()
    assert lora["properties"]["maxLoraRank"]["enum"] == [1, 8, 16, 32, 64, 128, 256, 320, 512]
    rules = {r["fieldPath"]: r["rule"] for r in lora["x-kubernetes-validations"]}
    assert rules[".adapters"] == (
        "!has(self.adapters) || self.adapters.all(a, !has(a.rank) || a.rank <= "
        "(has(self.maxLoraRank) ? self.maxLoraRank : 16))"
    )
    assert (
        rules[".maxCpuLoras"]
        == "!has(self.maxCpuLoras) || self.maxCpuLoras >= (has(self.maxLoras) ? self.maxLoras : 1)"
    )
    item = lora["properties"]["adapters"]["items"]["properties"]
    assert item["name"]["x-kubernetes-validations"] == api.cel_rules(api.ADAPTER_NAME_RULES)
    source = item["source"]
    assert source["x-kubernetes-validations"] == [
        {
            "rule": "has(self.huggingFace) != has(self.path)",
            "message": "set exactly one of huggingFace or path",
        }
    ]
    assert source["properties"]["path"]["x-kubernetes-validations"] == api.cel_rules(api.CACHE_PATH_RULES)
    revision = source["properties"]["huggingFace"]["properties"]["revision"]
    assert revision["x-kubernetes-validations"] == api.cel_rules(api.COMMIT_RULES)
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    claim = {r["fieldPath"]: r for r in spec["x-kubernetes-validations"]}[".lora.adapters"]
    assert "has(a.source.path)" in claim["rule"] and "has(self.model.cache.claimName)" in claim["rule"]


# --- names the gateway's nginx.conf and njs module carry -------------------------------------------------


def _gateway_names(name: str) -> dict[str, Any]:
    """The A100 example with `name` in every name field but the adapters' (DNS labels): the checkpoint's
    (a declared one), the served name, a tier's and its spill-over, an alias's and its picks, and a
    limited key's model."""
    tier, served, alias = f"t{name}", f"v{name}", f"a{name}"
    body = with_spec(
        gateway={
            "tiers": [{"name": tier, "deploymentRef": {"name": "small"}, "spillTo": served}],
            "aliases": [{"name": alias, "rules": [{"model": tier}], "default": served}],
            "modelAccess": [{"apiKeys": ["team-a"], "models": [alias]}],
        }
    )
    body["spec"]["model"] = {
        "name": f"n{name}",
        "servedModelName": served,
        "checkpoint": {"quantization": "bf16", "weightSize": "65G"},
    }
    return body


_GATEWAY_NAME_FIELDS = [
    "spec.model.name",
    "spec.model.servedModelName",
    "spec.gateway.modelAccess[0].models[0]",
    "spec.gateway.tiers[0].name",
    "spec.gateway.tiers[0].spillTo",
    "spec.gateway.aliases[0].name",
    "spec.gateway.aliases[0].rules[0].model",
    "spec.gateway.aliases[0].default",
]


@pytest.mark.parametrize("char", ["$", "'", '"', "\\", "\n", "\t", "\x7f", "é"])
def test_every_name_the_gateway_carries_refuses_what_nginx_cannot_quote(char: str) -> None:
    found = dict(problems(_gateway_names(f"x{char}y")))
    assert sorted(found) == sorted(_GATEWAY_NAME_FIELDS), found
    assert all("cannot quote" in message for message in found.values()), found
    adapters = {"adapters": [adapter(f"x{char}y")]}
    assert [p for p, _ in problems(with_lora(adapters))] == ["spec.lora.adapters[0].name"]


def test_a_served_name_with_a_dollar_is_refused_with_its_field_path() -> None:
    body = with_spec()
    body["spec"]["model"]["servedModelName"] = "chat$v2"
    [(path, message)] = problems(body)
    assert path == "spec.model.servedModelName"
    assert message.startswith("'chat$v2' has a character") and "cannot quote" in message


def test_the_crd_has_the_same_pattern_on_every_name_the_gateway_carries() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    model, g = spec["model"]["properties"], spec["gateway"]["properties"]
    alias = g["aliases"]["items"]["properties"]
    schemas = [
        model["name"],
        model["servedModelName"],
        g["modelAccess"]["items"]["properties"]["models"]["items"],
        g["tiers"]["items"]["properties"]["name"],
        g["tiers"]["items"]["properties"]["spillTo"],
        alias["name"],
        alias["rules"]["items"]["properties"]["model"],
        alias["default"],
    ]
    assert [s.get("pattern") for s in schemas] == [api.MODEL_NAME_PATTERN] * len(schemas)


def test_printable_ascii_but_the_four_is_a_name() -> None:
    legal = "".join(c for c in map(chr, range(32, 127)) if c not in "$'\"\\")
    parse(_gateway_names(legal))  # every field takes it
    assert re.fullmatch(api.MODEL_NAME_PATTERN, legal)
