"""The QwenDeployment custom resource as pydantic models: the single source of the CRD schema.

Fields are camelCase on the wire and unknown fields are rejected. Defaults are applied here, when the
operator parses a resource, and never written back: the stored object stays as the user wrote it, so
GitOps tools see no drift, and a new operator version can improve a default for everyone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from .catalog import (
    DEFAULT_ENGINE_IMAGE,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPUS,
    KNOWN_NODE_LABELS,
    MAX_CONTEXT,
    MODELS,
    SHAPES,
    GpuInfo,
    architecture_of,
    node_label_values,
)
from .quantity import quantity_bytes

GROUP = "inference.qwenops.dev"
VERSION = "v1alpha1"
KIND = "QwenDeployment"
PLURAL = "qwendeployments"
API_VERSION = f"{GROUP}/{VERSION}"

#: The catalog's GPU types (catalog.GPUS, same order), and Custom: a GPU declared in spec.gpu.custom.
GpuType = Literal[
    "A10-24GB",
    "A10G-24GB",
    "L4-24GB",
    "RTX-4090-24GB",
    "L40S-48GB",
    "RTX-6000-Ada-48GB",
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "H100-NVL-94GB",
    "H200-141GB",
    "H200-NVL-141GB",
    "RTX-PRO-6000-Blackwell-96GB",
    "B200-180GB",
    "Custom",
]
CUSTOM_GPU = "Custom"
#: vLLM 0.32 --quantization values served here: the checkpoint's own method, or online FP8 of a 16-bit
#: checkpoint (fp8_per_tensor, fp8_per_block; vllm/config/quantization.py `_ONLINE_SHORTHANDS`).
Quantization = Literal[
    "none", "fp8", "fp8_per_tensor", "fp8_per_block", "awq", "awq_marlin", "gptq", "gptq_marlin"
]
#: How a checkpoint's weights are stored (community checkpoints declare it).
CheckpointQuantization = Literal["bf16", "fp8", "awq", "gptq"]
KubeObject = Annotated[
    dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
]


def _number_as_string(value: Any) -> Any:
    # The CRD declares quantities int-or-string, as Kubernetes does: `cpu: 8` is as valid as `cpu: "8"`.
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


Quantity = Annotated[
    str,
    BeforeValidator(_number_as_string),
    Field(
        pattern=r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$",
        json_schema_extra={"x-kubernetes-int-or-string": True},
    ),
]
DnsName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]


@dataclass(frozen=True)
class StringRule:
    """A rule on a string that pydantic and the API server (as CEL) check alike, with one message.

    `pattern` is written once for both: a regex that RE2 (CEL's `matches`) and Python read the same way,
    searched, not anchored unless it says so, and without backslashes (a CEL string literal would need
    them doubled).
    """

    pattern: str
    message: str
    must_match: bool = True  # False: the value must not match

    def broken_by(self, value: str) -> bool:
        return (re.search(self.pattern, value) is None) == self.must_match

    def cel(self, subject: str = "self") -> str:
        test = f"{subject}.matches('{self.pattern}')"
        return test if self.must_match else f"!{test}"


def cel_rules(rules: tuple[StringRule, ...]) -> list[dict[str, str]]:
    """The rules as x-kubernetes-validations of the string they apply to."""
    return [{"rule": r.cel(), "message": r.message} for r in rules]


def checked_by(rules: tuple[StringRule, ...]) -> AfterValidator:
    """A pydantic validator raising the first broken rule's message."""

    def check(value: str) -> str:
        broken = next((r for r in rules if r.broken_by(value)), None)
        if broken is not None:
            raise PydanticCustomError("string_rule", "{message}", {"message": broken.message})
        return value

    return AfterValidator(check)


#: An image must be pinned: the engine's flags are checked against one vLLM version, and an untagged
#: or :latest image changes under a running deployment (nodes pull whatever it is that day).
IMAGE_RULES = (
    StringRule(
        "^[^@]+:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$|@sha256:[a-f0-9]{64}$",
        "name a tag or a digest, e.g. vllm/vllm-openai:v0.32.0 or vllm/vllm-openai@sha256:<64 hex digits>; "
        "without one every node pulls whatever :latest is that day",
    ),
    StringRule(
        ":latest$",
        ":latest moves whenever a new image is pushed, so replicas started on different days run "
        "different versions; pin a version tag or a digest",
        must_match=False,
    ),
)
Image = Annotated[
    str,
    checked_by(IMAGE_RULES),
    Field(
        min_length=1, max_length=512, json_schema_extra={"x-kubernetes-validations": cel_rules(IMAGE_RULES)}
    ),
]
PROMETHEUS_URL_RULES = (
    StringRule(
        "^https?://[^/ ]+",
        "a URL with scheme and host, e.g. http://prometheus-operated.monitoring.svc:9090 (KEDA's "
        "Prometheus trigger calls it)",
    ),
)
PrometheusUrl = Annotated[
    str,
    checked_by(PROMETHEUS_URL_RULES),
    Field(max_length=2048, json_schema_extra={"x-kubernetes-validations": cel_rules(PROMETHEUS_URL_RULES)}),
]

#: Model names: the base model's (spec.model.name, servedModelName), the tiers', the aliases' and every
#: name that refers to one of them. The gateway carries them in nginx.conf's quoted strings and JSON
#: bodies and in its njs module, where `$` would start a variable, a quote end the string, a backslash or
#: a control character become another character, and one outside ASCII a `\u` escape: printable ASCII
#: but those four. An OpenAPI pattern, so the API server refuses the rest too (at no CEL cost, however long
#: the lists); adapter names are DNS labels, a subset.
MODEL_NAME_PATTERN = r"^[ !#%&(-\[\]-~]*$"


def _quotable(name: str) -> str:
    # fullmatch: Python's `$` also matches before a final newline, Go's (the API server's) does not
    if re.fullmatch(MODEL_NAME_PATTERN, name) is None:
        raise PydanticCustomError(
            "model_name",
            "{name} has a character outside printable ASCII or one of $ ' \" \\, which the gateway's "
            "configuration cannot quote; choose another name",
            {"name": repr(name)},
        )
    return name


#: A model name of any length (spec.model's, which have no maxLength).
QuotableName = Annotated[
    str, Field(json_schema_extra={"pattern": MODEL_NAME_PATTERN}), AfterValidator(_quotable)
]
#: A model name clients send, or that names one.
ModelName = Annotated[QuotableName, Field(min_length=1, max_length=256)]


class Model(BaseModel):
    """Common settings: camelCase only (as in the CRD), unknown fields rejected, assignment validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,  # snake_case would pass here but be pruned or refused by the API server
        extra="forbid",
        validate_assignment=True,
    )


def field_error(field: str, message: str) -> PydanticCustomError:
    """An error of a cross-field rule, reported at `field` (camelCase) below the model it is raised in."""
    return PydanticCustomError("field_rule", "{message}", {"field": field, "message": message})


#: Env vars the operator sets on the engine container itself (manifests/engine.py), with the field
#: behind each (None: no field). An entry of the same name in engine.env would clash with the
#: operator's (server-side apply refuses two entries of one name) or put a secret in the pod spec.
OPERATOR_ENV: dict[str, str | None] = {
    "HF_HOME": "spec.model.cache",
    "HF_HUB_OFFLINE": "spec.model.offline",
    "HF_TOKEN": "spec.model.hfTokenSecret",
    "VLLM_API_KEY": "spec.engine.apiKeySecret",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "spec.lora",
    "VLLM_NO_USAGE_STATS": None,
    "DO_NOT_TRACK": None,
}


def _operator_env_message(name: str) -> str:
    field = OPERATOR_ENV[name]
    if field is None:
        return f"{name} is set by the operator (usage reporting stays off); remove the entry"
    return f"{name} is set by the operator from {field}; use that field and remove the entry"


def _env_entry(entry: dict[str, Any]) -> dict[str, Any]:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise field_error("name", "required field is missing (the variable's name)")
    if name in OPERATOR_ENV:
        raise field_error("name", _operator_env_message(name))
    return entry


EnvVar = Annotated[
    dict[str, Any],
    AfterValidator(_env_entry),
    Field(
        json_schema_extra={
            "x-kubernetes-preserve-unknown-fields": True,  # value, valueFrom: the Kubernetes EnvVar
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}},
            "x-kubernetes-validations": [
                {
                    "rule": f"!(self.name in {sorted(OPERATOR_ENV)})",
                    "message": f"{', '.join(OPERATOR_ENV)} are set by the operator (from "
                    f"{', '.join(f for f in OPERATOR_ENV.values() if f)}); use those fields and "
                    "remove the entry",
                    "fieldPath": ".name",
                }
            ],
        }
    ),
]


class LocalObjectReference(Model):
    """An object of the QwenDeployment's namespace, by name."""

    name: DnsName = Field(description="Its name.")


class SecretKeyRef(Model):
    """A key of a Secret in the QwenDeployment's namespace."""

    name: DnsName = Field(description="Name of the Secret.")
    key: str = Field(default="token", min_length=1, description="Key in the Secret. Default `token`.")


_OFFLINE_NEEDS_CLAIM = (
    "offline serves only from the model cache, and without spec.model.cache.claimName the cache is an "
    "emptyDir that starts empty; name a prefilled PersistentVolumeClaim there, or turn offline off"
)


class ModelCache(Model):
    """Where downloaded weights live between restarts."""

    claim_name: DnsName | None = Field(
        default=None,
        description="Existing PersistentVolumeClaim (ReadWriteMany when replicas > 1) mounted as the "
        "Hugging Face cache. Unset: an emptyDir, so every new pod downloads the weights again.",
    )
    size_limit: Quantity | None = Field(
        default=None,
        description="sizeLimit of the emptyDir cache. Default: the checkpoint's files (and a draft "
        "model's) plus 20%.",
    )


class CommunityCheckpoint(Model):
    """A Qwen3-32B checkpoint the catalog lacks (a community GPTQ, AWQ or FP8 build): the planner
    checks it like a catalog model from what is declared here."""

    quantization: CheckpointQuantization = Field(
        description="How its weights are stored (`quant_method` of its config.json; bf16 for none). "
        "gptq checkpoints are served with gptq or gptq_marlin, awq with awq or awq_marlin."
    )
    weight_size: Quantity = Field(
        description="Bytes of its weights: the sum of its *.safetensors files, e.g. `19.3G` or `18Gi`."
    )

    @property
    def weight_bytes(self) -> int:
        return quantity_bytes(self.weight_size)


class ModelSource(Model):
    """Which checkpoint to serve and where its weights come from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.offline) || !self.offline || "
                    "(has(self.cache) && has(self.cache.claimName))",
                    "message": _OFFLINE_NEEDS_CLAIM,
                    "fieldPath": ".offline",
                }
            ]
        }
    )

    name: QuotableName = Field(
        min_length=1,
        description=f"Hugging Face id of the checkpoint: one of the catalog's ({', '.join(MODELS)}), "
        "or any Qwen3-32B checkpoint declared in `checkpoint`. Printable ASCII without $ ' \" \\ "
        "(the default served name, which the gateway's configuration quotes).",
    )
    checkpoint: CommunityCheckpoint | None = Field(
        default=None,
        description="Declares a community Qwen3-32B checkpoint (same architecture, other storage) the "
        "catalog lacks: its quantization and weight size. Not allowed for the catalog's own models.",
    )
    revision: str | None = Field(
        default=None, min_length=1, description="Git revision (tag or commit) to pin."
    )
    served_model_name: QuotableName | None = Field(
        default=None,
        min_length=1,
        description="Model name clients send. Default: `name`. Printable ASCII without $ ' \" \\ (the "
        "gateway's configuration quotes it).",
    )
    hf_token_secret: SecretKeyRef | None = Field(
        default=None, description="Secret holding a Hugging Face token (env HF_TOKEN) for gated downloads."
    )
    cache: ModelCache = Field(default_factory=ModelCache, description="Model cache volume.")
    offline: bool = Field(
        default=False,
        description="Serve only from the cache (HF_HUB_OFFLINE=1); needs cache.claimName, a prefilled claim.",
    )

    @model_validator(mode="after")
    def _offline_needs_a_claim(self) -> ModelSource:
        if self.offline and self.cache.claim_name is None:
            raise field_error("offline", _OFFLINE_NEEDS_CLAIM)
        return self


class CustomGpu(Model):
    """A GPU the catalog lacks, declared with the facts the plan needs."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$",
        description="Name shown in the plan.",
    )
    memory: Quantity = Field(
        description="Total memory as the CUDA runtime reports it (torch.cuda.mem_get_info()[1], the "
        "'total capacity' of a PyTorch out-of-memory message), a little below nvidia-smi's figure: "
        "e.g. `79.1Gi` for an 80 GB card."
    )
    compute_capability: str = Field(
        pattern=r"^[0-9]{1,2}\.[0-9]$",
        description="CUDA compute capability, e.g. 8.0 (A100), 8.6 (A10), 8.9 (Ada), 9.0 (Hopper), "
        "10.0 (B200), 12.0 (RTX PRO 6000 Blackwell); decides the fp8 KV cache attention backend.",
    )
    fp8_compute: bool | None = Field(
        default=None,
        description="FP8 tensor cores (W8A8). Default: compute capability 8.9 or newer.",
    )
    product_labels: list[str] = Field(
        min_length=1,
        description="Values of the node label nvidia.com/gpu.product of this GPU (GPU feature discovery).",
    )

    def info(self) -> GpuInfo:
        major, minor = (int(n) for n in self.compute_capability.split("."))
        fp8 = self.fp8_compute if self.fp8_compute is not None else (major, minor) >= (8, 9)
        return GpuInfo(
            type=self.name,
            memory_bytes=quantity_bytes(self.memory),
            fp8_compute=fp8,
            architecture=architecture_of((major, minor)),
            product_labels=tuple(self.product_labels),
            compute_capability=(major, minor),
        )


class NodeLabel(Model):
    """The node label that names the GPU model, for clusters without GPU feature discovery's."""

    key: str = Field(
        min_length=1,
        max_length=317,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description=f"Label key: `{GPU_PRODUCT_LABEL}` (GPU feature discovery, the default), "
        "`cloud.google.com/gke-accelerator` (GKE), or any label your nodes carry (EKS: "
        "`eks.amazonaws.com/instance-gpu-name` in Auto Mode, `karpenter.k8s.aws/instance-gpu-name` "
        "with Karpenter, or one your node groups set) together with `values`.",
    )
    values: list[Annotated[str, Field(min_length=1, max_length=63)]] | None = Field(
        default=None,
        min_length=1,
        description="Label values of this GPU type (nodes with any of them are in the pool). Default: the "
        f"catalog's for {' and '.join(KNOWN_NODE_LABELS)}; required for other keys and for type Custom "
        "on another key than GPU feature discovery's.",
    )


_NODE_LABEL_REPLACED = (
    "nodeLabel chooses the label of the default node selection, which nodeSelector and affinity "
    "replace; set nodeLabel or those, not both"
)


class GpuPool(Model):
    """The GPU node pool the engine pods run on."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(self.type == 'Custom') == has(self.custom)",
                    "message": "type Custom needs custom (the GPU's memory, compute capability and "
                    "product labels); other types take theirs from the catalog",
                    "fieldPath": ".custom",
                },
                {
                    "rule": "!has(self.nodeLabel) || !(has(self.nodeSelector) || has(self.affinity))",
                    "message": _NODE_LABEL_REPLACED,
                    "fieldPath": ".nodeLabel",
                },
            ]
        }
    )

    type: GpuType = Field(
        description="GPU type; sets memory for the plan and the default node selection. Custom: the GPU "
        "declared in `custom`."
    )
    custom: CustomGpu | None = Field(default=None, description="A GPU the catalog lacks (type Custom).")
    gpus_per_node: int = Field(
        default=8, ge=1, le=16, description="GPUs on one node of the pool; a replica never spans nodes."
    )
    node_label: NodeLabel | None = Field(
        default=None,
        description=f"The node label the default selection reads (default `{GPU_PRODUCT_LABEL}` in the "
        "GPU type's usual values); status.plan.nodeSelection says what is selected.",
    )
    node_selector: dict[str, str] | None = Field(
        default=None,
        description="Replaces the default selection (nvidia.com/gpu.product in the GPU type's usual values).",
    )
    affinity: KubeObject | None = Field(default=None, description="Pod affinity; replaces the default.")
    tolerations: list[KubeObject] | None = Field(
        default=None, description="Replaces the default toleration of the nvidia.com/gpu taint."
    )
    resource_name: str = Field(default=GPU_RESOURCE, description="Extended resource name of the GPU.")
    runtime_class_name: DnsName | None = Field(
        default=None,
        description="RuntimeClass of the engine pods, where the GPU runtime is not the nodes' default: "
        "`nvidia` on k3s and RKE2, and with the GPU Operator when it does not set the default runtime.",
    )

    @model_validator(mode="after")
    def _custom_iff_type_custom(self) -> GpuPool:
        if self.type == CUSTOM_GPU and self.custom is None:
            raise field_error("custom", "type Custom needs custom (memory, computeCapability, productLabels)")
        if self.type != CUSTOM_GPU and self.custom is not None:
            raise field_error("custom", f"{self.type} is in the catalog; custom needs type Custom")
        return self

    @model_validator(mode="after")
    def _node_label_has_values(self) -> GpuPool:
        label = self.node_label
        if label is None:
            return self
        if self.node_selector is not None or self.affinity is not None:
            raise field_error("nodeLabel", _NODE_LABEL_REPLACED)
        if label.values is None and not self.node_label_values():
            known = f"the catalog knows the values of {', '.join(KNOWN_NODE_LABELS)} only"
            if label.key in KNOWN_NODE_LABELS:
                known = f"the catalog has no value of {label.key} for {self.info().type}"
            raise field_error(
                "nodeLabel.values",
                f"{known}; list the values your {self.info().type} nodes carry "
                f"(kubectl get nodes -L {label.key})",
            )
        return self

    def node_label_key(self) -> str:
        return self.node_label.key if self.node_label else GPU_PRODUCT_LABEL

    def node_label_values(self) -> tuple[str, ...]:
        """The label values of the default node selection (the spec's, else the catalog's)."""
        if self.node_label and self.node_label.values is not None:
            return tuple(self.node_label.values)
        key = self.node_label_key()
        if self.custom is not None and key != GPU_PRODUCT_LABEL:
            return ()  # a custom GPU declares its GPU feature discovery values only
        return node_label_values(key, self.info())

    def info(self) -> GpuInfo:
        """The GPU's facts: the catalog's, or those declared in `custom`."""
        return self.custom.info() if self.custom is not None else GPUS[self.type]


class Parallelism(Model):
    """Model parallelism of one replica; GPUs per replica = tensor x pipeline."""

    tensor: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="Tensor parallel size: must divide the model's attention heads, and its 8 KV heads "
        "or be a multiple of them (vLLM's rule; FP8 and AWQ checkpoints also need whole 128-wide blocks "
        "per GPU); the plan lists the valid sizes. Default: "
        + ", ".join(
            f"{s.default_tensor_parallel} for Qwen3-{s.size}"
            for s in SHAPES.values()
            if s.default_tensor_parallel > 1
        )
        + ", 1 for the smaller sizes.",
    )
    pipeline: int = Field(default=1, ge=1, le=8, description="Pipeline parallel size.")


_LOOKUP_MAX, _LOOKUP_MIN = 4, 2


class NgramSpeculation(Model):
    """Prompt-lookup (n-gram) speculative decoding: no draft model, helps on repetitive outputs."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {  # defaults are not stored, so the rule restates them
                    "rule": f"(has(self.promptLookupMin) ? self.promptLookupMin : {_LOOKUP_MIN}) <= "
                    f"(has(self.promptLookupMax) ? self.promptLookupMax : {_LOOKUP_MAX})",
                    "message": "promptLookupMin must not exceed promptLookupMax",
                    "fieldPath": ".promptLookupMin",
                }
            ]
        }
    )

    method: Literal["ngram"]
    num_speculative_tokens: int = Field(default=4, ge=1, le=16, description="Tokens proposed per step.")
    prompt_lookup_max: int = Field(default=_LOOKUP_MAX, ge=1, le=16, description="Longest n-gram matched.")
    prompt_lookup_min: int = Field(default=_LOOKUP_MIN, ge=1, le=16, description="Shortest n-gram matched.")

    @model_validator(mode="after")
    def _min_le_max(self) -> NgramSpeculation:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise field_error(
                "promptLookupMin",
                f"{self.prompt_lookup_min} exceeds promptLookupMax ({self.prompt_lookup_max})",
            )
        return self


class DraftModelSpeculation(Model):
    """A small draft model proposes tokens the target model verifies."""

    method: Literal["draft_model"]
    model: str = Field(min_length=1, description="Draft checkpoint, e.g. Qwen/Qwen3-0.6B (same tokenizer).")
    num_speculative_tokens: int = Field(default=4, ge=1, le=16, description="Tokens proposed per step.")


class Eagle3Speculation(Model):
    """EAGLE-3 draft head trained for the target model."""

    method: Literal["eagle3"]
    model: str = Field(min_length=1, description="EAGLE-3 head checkpoint for Qwen3-32B.")
    num_speculative_tokens: int = Field(default=3, ge=1, le=16, description="Tokens proposed per step.")


Speculative = Annotated[
    NgramSpeculation | DraftModelSpeculation | Eagle3Speculation, Field(discriminator="method")
]


class Reasoning(Model):
    """Qwen3 thinking mode: the reasoning parser splits <think> content into `reasoning_content`."""

    enabled: bool = Field(default=True, description="Pass --reasoning-parser.")
    parser: str = Field(default="qwen3", min_length=1, description="vLLM reasoning parser name.")


class ToolCalling(Model):
    """OpenAI-style tool calls parsed from Qwen3's Hermes-format output."""

    enabled: bool = Field(default=True, description="Pass --enable-auto-tool-choice and --tool-call-parser.")
    parser: str = Field(default="hermes", min_length=1, description="vLLM tool-call parser name.")


class Resources(Model):
    """CPU and memory of the engine container (GPUs always come from parallelism)."""

    cpu: Quantity = Field(default="8", description="CPU request (no CPU limit: throttling hurts latency).")
    memory: Quantity = Field(default="64Gi", description="Memory request and limit.")
    shm_size: Quantity = Field(default="16Gi", description="Size of the memory-backed /dev/shm (NCCL).")
    ephemeral_storage: Quantity | None = Field(
        default=None,
        description="ephemeral-storage request and limit of the engine container (node disk: its "
        "writable layer, logs, and the model cache when it is an emptyDir). Default: the emptyDir "
        "cache's size limit (none with cache.claimName) plus 10Gi for vLLM's compile caches and logs.",
    )


class Probes(Model):
    """Overrides of the probe budgets the operator sizes from the model."""

    startup_seconds: int | None = Field(
        default=None, ge=60, le=14_400, description="Time allowed to load and warm up. Default: from weights."
    )


class Engine(Model):
    """vLLM engine settings. Each maps to one flag of the pinned vLLM version."""

    image: Image | None = Field(
        default=None,
        description=f"Engine image, pinned by a tag other than latest or by a digest. Default "
        f"`{DEFAULT_ENGINE_IMAGE}`.",
    )
    max_model_len: int = Field(
        default=32_768,
        ge=256,
        description="Context length; above the model's max_position_embeddings (40960) enables YaRN, "
        f"up to {MAX_CONTEXT} on Qwen3-4B and larger (Qwen3-0.6B and 1.7B: at most 40960).",
    )
    max_num_seqs: int = Field(default=256, ge=1, le=4096, description="Requests batched at once per replica.")
    max_num_batched_tokens: int = Field(
        default=8192, ge=64, description="Token budget of one scheduler step (small: lower ITL, large: TTFT)."
    )
    enable_chunked_prefill: bool = Field(
        default=True,
        description="Split long prompts across steps. vLLM 0.32 warns that turning it off for this model "
        "may crash the engine or give wrong output; the plan warns too.",
    )
    enable_prefix_caching: bool = Field(
        default=True, description="Reuse KV blocks of shared prompt prefixes."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.1, le=0.98, description="Share of each GPU's memory vLLM may use."
    )
    quantization: Quantization | None = Field(
        default=None,
        description="Serving quantization. Default: the checkpoint's own (none for bf16). fp8_per_tensor "
        "or fp8_per_block quantize a bf16 checkpoint to FP8 at load; fp8 serves an FP8 checkpoint.",
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        default="auto", description="KV cache element type; fp8 halves KV bytes per token."
    )
    speculative: Speculative | None = Field(default=None, description="Speculative decoding.")
    reasoning: Reasoning = Field(default_factory=Reasoning, description="Qwen3 reasoning parser.")
    tool_calling: ToolCalling = Field(default_factory=ToolCalling, description="Tool-call parsing.")
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret with the key the engine requires (env VLLM_API_KEY); the gateway sends it.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Further vLLM flags, checked against the pinned vLLM parser. Refused, each with its "
        "reason: flags the operator sets (from a field here, or fixed such as --host and --port), and "
        "flags that would open the engine beside the gateway, change the model served or stop its metrics.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=256,
        description="Extra container env entries (Kubernetes EnvVar). Not the variables the operator sets: "
        + ", ".join(OPERATOR_ENV)
        + ".",
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory.")
    probes: Probes = Field(default_factory=Probes, description="Probe budget overrides.")
    termination_grace_period_seconds: int = Field(
        default=120,
        ge=0,
        le=3600,
        description="Longest time a terminating engine pod takes (rollout, scale-in, node drain): a "
        "10 s preStop while the router drops it, then vLLM finishes its running requests for the rest "
        "less 5 s (--shutdown-timeout; status.plan.drainSeconds.engine) and aborts those still running.",
    )
    priority_class_name: str | None = Field(default=None, description="PriorityClass of engine pods.")
    upgrade_policy: Literal["OnEdit", "Immediate"] = Field(
        default="OnEdit",
        description="When a new operator version renders another engine pod for an unchanged spec (a "
        "default flag, image or pod setting changed): OnEdit keeps the running engines until the "
        "QwenDeployment's spec is next edited, and status.engineUpdate says what would change; Immediate "
        "rolls them to the new form at once. Edits always apply (docs/reliability.md).",
    )


# --- LoRA adapters ----------------------------------------------------------------------------------

#: --max-lora-rank values vLLM 0.32 accepts (vllm/config/lora.py `MaxLoRARanks`).
MaxLoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
#: vLLM's defaults (config/lora.py LoRAConfig), restated in the CEL rules, which see no defaults.
DEFAULT_MAX_LORAS = 1
DEFAULT_MAX_LORA_RANK: MaxLoraRank = 16
#: Most adapters one resource declares (bounds the cost of the CEL rules that walk the list).
MAX_ADAPTERS = 128

ADAPTER_NAME_RULES = (
    StringRule(
        "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        "lowercase letters, digits and '-', starting and ending with a letter or digit (a DNS label, "
        "so that it can name Kubernetes objects and label values); clients send it as the model",
    ),
)
HF_REPO_RULES = (
    StringRule(
        "^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$",
        "a Hugging Face repository id, owner/name (e.g. my-org/qwen3-32b-sql-lora)",
    ),
)
COMMIT_RULES = (
    StringRule(
        "^[0-9a-f]{40}$",
        "a commit hash (40 lowercase hex digits): a branch or tag can move, and replicas that load the "
        "adapter at different times would serve different weights",
    ),
)
CACHE_PATH_RULES = (
    StringRule("^[-A-Za-z0-9_./]+$", "letters, digits, '-', '_', '.' and '/' only"),
    StringRule(
        "^/",
        "a path relative to the root of the model cache volume (e.g. loras/sql-expert), not an absolute one",
        must_match=False,
    ),
    StringRule("(^|/)[.][.](/|$)", "'..' would leave the model cache volume", must_match=False),
)


def _cel(rules: tuple[StringRule, ...]) -> dict[str, Any]:
    return {"x-kubernetes-validations": cel_rules(rules)}


# Field first: the length limits apply to the string before the rules run.
AdapterName = Annotated[
    str,
    Field(min_length=1, max_length=63, json_schema_extra=_cel(ADAPTER_NAME_RULES)),
    checked_by(ADAPTER_NAME_RULES),
]
HfRepo = Annotated[
    str, Field(min_length=3, max_length=200, json_schema_extra=_cel(HF_REPO_RULES)), checked_by(HF_REPO_RULES)
]
CommitHash = Annotated[
    str, Field(max_length=40, json_schema_extra=_cel(COMMIT_RULES)), checked_by(COMMIT_RULES)
]
CachePath = Annotated[
    str,
    Field(min_length=1, max_length=512, json_schema_extra=_cel(CACHE_PATH_RULES)),
    checked_by(CACHE_PATH_RULES),
]


class HuggingFaceAdapter(Model):
    """An adapter in a Hugging Face repository, at one commit."""

    repo: HfRepo = Field(description="Repository id, owner/name.")
    revision: CommitHash = Field(
        description="Commit hash (40 hex digits) to load; branches and tags move, so they are refused."
    )


_ONE_SOURCE = "set exactly one of huggingFace or path"


class AdapterSource(Model):
    """Where an adapter's files (adapter_config.json, adapter_model.safetensors) come from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(self.huggingFace) != has(self.path)", "message": _ONE_SOURCE}
            ]
        }
    )

    hugging_face: HuggingFaceAdapter | None = Field(
        default=None, description="A Hugging Face repository at a pinned commit."
    )
    path: CachePath | None = Field(
        default=None,
        description="A directory in the model cache volume, relative to its root (needs "
        "spec.model.cache.claimName: an emptyDir cache starts empty).",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> AdapterSource:
        if (self.hugging_face is None) == (self.path is None):
            raise field_error("huggingFace" if self.hugging_face is None else "path", _ONE_SOURCE)
        return self


class LoraAdapter(Model):
    """One LoRA adapter of Qwen3-32B, served under its own model name."""

    name: AdapterName = Field(description="Model name clients send in `model` to use this adapter.")
    source: AdapterSource = Field(description="Where its files come from.")
    rank: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="Its rank (`r` in adapter_config.json), if known: checked against maxLoraRank here "
        "instead of when vLLM loads it.",
    )


_RANK_OVER_MAX = (
    "an adapter's rank exceeds maxLoraRank (default 16): vLLM refuses to load an adapter of a higher rank "
    "than its slots; raise maxLoraRank"
)
_CPU_BELOW_SLOTS = (
    "maxCpuLoras must be at least maxLoras (default 1): every adapter in a GPU slot is also held in the "
    "CPU cache, and vLLM refuses fewer"
)


def _allowed_rank_at_least(rank: int) -> int:
    return next(r for r in get_args(MaxLoraRank) if r >= rank)


class Lora(Model):
    """LoRA adapters served beside the base model. The slot settings (maxLoras, maxLoraRank,
    maxCpuLoras) are engine flags, so changing them restarts the engines; the adapter list is kept out
    of the engine pod (adapters are loaded into running engines), so changing it does not."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!has(self.adapters) || self.adapters.all(a, !has(a.rank) || a.rank <= "
                    f"(has(self.maxLoraRank) ? self.maxLoraRank : {DEFAULT_MAX_LORA_RANK}))",
                    "message": _RANK_OVER_MAX,
                    "fieldPath": ".adapters",
                },
                {
                    "rule": "!has(self.maxCpuLoras) || self.maxCpuLoras >= "
                    f"(has(self.maxLoras) ? self.maxLoras : {DEFAULT_MAX_LORAS})",
                    "message": _CPU_BELOW_SLOTS,
                    "fieldPath": ".maxCpuLoras",
                },
            ]
        }
    )

    max_loras: int = Field(
        default=DEFAULT_MAX_LORAS,
        ge=1,
        description="GPU slots: adapters one batch can use at once (--max-loras). Each slot holds an "
        "adapter of maxLoraRank in every layer it targets, memory taken from the KV cache "
        "(status.plan.loraGiBPerGpu).",
    )
    max_lora_rank: MaxLoraRank = Field(
        default=DEFAULT_MAX_LORA_RANK,
        description="Rank every slot is sized for (--max-lora-rank): one of 1, 8, 16, 32, 64, 128, 256, "
        "320, 512; an adapter of a higher rank cannot be loaded.",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        description="Adapters each engine keeps loaded in host memory (--max-cpu-loras); the least "
        "recently used beyond it is dropped and read from its files again when next requested. Default: "
        "maxLoras.",
    )
    adapters: list[LoraAdapter] = Field(
        default_factory=list,
        max_length=MAX_ADAPTERS,
        description="The adapters, each requested by its name. Not part of the engine pod: adding or "
        "removing one restarts no engine (docs/lora.md).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @property
    def effective_max_cpu_loras(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras

    @model_validator(mode="after")
    def _adapters_fit_the_slots(self) -> Lora:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise field_error(
                "maxCpuLoras",
                f"{self.max_cpu_loras} is below maxLoras ({self.max_loras}): every adapter in a GPU slot is "
                "also held in the CPU cache, and vLLM refuses fewer",
            )
        first: dict[str, int] = {}
        for i, adapter in enumerate(self.adapters):
            if adapter.name in first:
                raise field_error(
                    f"adapters[{i}].name",
                    f"{adapter.name!r} is also the name of adapters[{first[adapter.name]}]; a request names "
                    "its adapter, so names must be unique",
                )
            first[adapter.name] = i
            if adapter.rank is not None and adapter.rank > self.max_lora_rank:
                raise field_error(
                    f"adapters[{i}].rank",
                    f"{adapter.rank} exceeds maxLoraRank ({self.max_lora_rank}): vLLM refuses to load an "
                    "adapter of a higher rank than its slots; raise maxLoraRank to "
                    f"{_allowed_rank_at_least(adapter.rank)}",
                )
        return self


class ScalingBehavior(Model):
    """HPA behaviour: add replicas fast, remove them slowly. Engines take minutes to start, so the
    defaults follow the engine's start-up budget (engine.probes.startupSeconds, default from the
    weights); see docs/autoscaling.md."""

    scale_up_stabilization_seconds: int = Field(
        default=0, ge=0, le=3600, description="Scale-up window (0: act on the first high reading)."
    )
    scale_up_pods: int = Field(
        default=2,
        ge=1,
        le=100,
        description="Pods added per scale-up period at most (or the replica count doubled, if more).",
    )
    scale_up_period_seconds: int | None = Field(
        default=None,
        ge=15,
        le=1800,
        description="Scale-up period: the HPA adds no more pods until the last ones could be serving. "
        "Default: the engine's start-up budget, at most 1800.",
    )
    scale_down_stabilization_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="Scale-down window: the queue must stay low this long before a replica is removed. "
        "Default: the engine's start-up budget (time to get a removed replica back), 300 to 3600.",
    )
    scale_down_pods: int = Field(default=1, ge=1, le=100, description="Pods removed per scale-down period.")
    scale_down_period_seconds: int = Field(default=300, ge=15, le=1800, description="Scale-down period.")


class ScaleToZero(Model):
    """Engines at zero replicas after an idle period, and what the gateway does with the requests that
    arrive then: it holds them (the activator sidecar) until an engine is ready. Applies with
    autoscaling.minReplicas 0; see docs/autoscaling.md, "Scale to zero"."""

    idle_seconds: int = Field(
        default=1800,
        ge=60,
        le=86_400,
        description="Seconds without requests after which the engines go to zero. The first request after "
        "that waits a whole cold start (status.plan.scaleToZero.expectedColdStartSeconds).",
    )
    hold_seconds: int | None = Field(
        default=None,
        ge=5,
        le=14_400,
        description="Longest a request waits in the gateway for an engine to become ready; then a JSON 503 "
        "with Retry-After (an error event for a stream). Default: twice the expected cold start (weights "
        "read from the model cache plus the engine's start-up), in whole minutes, at most the engine's "
        "start-up budget.",
    )
    max_held_requests: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Requests the whole gateway holds at once, split across its pods; beyond them a JSON "
        "503 with Retry-After at once. Default: 2 x maxNumSeqs, what the first engine takes at once "
        "(a batch running and as many waiting).",
    )


class Autoscaling(Model):
    """Queue-depth autoscaling on the engines' waiting requests (vllm:num_requests_waiting per engine pod,
    read by the HPA as the custom metric qwen_queue_depth)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.driver) || self.driver != 'keda' || has(self.prometheusAddress)",
                    "message": "driver keda needs prometheusAddress",
                    "fieldPath": ".prometheusAddress",
                },
                {
                    "rule": "!has(self.minReplicas) || self.minReplicas > 0 || "
                    "(has(self.driver) && self.driver == 'keda')",
                    "message": "minReplicas 0 needs driver keda (the HPA cannot scale to zero)",
                    "fieldPath": ".minReplicas",
                },
            ]
        }
    )

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Fewest replicas. 0: no engine after scaleToZero.idleSeconds without requests; the "
        "gateway holds requests while an engine starts (needs driver keda and the gateway).",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    target_queue_depth: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Average waiting requests per engine pod the autoscaler aims for. Default: from the "
        "plan, a tenth of the requests a replica runs at once (status.autoscaling shows it).",
    )
    driver: Literal["hpa", "keda"] = Field(
        default="hpa",
        description="hpa: autoscaling/v2 on the pods custom metric qwen_queue_depth (needs "
        "prometheus-adapter with the chart's rule); keda: a ScaledObject with a Prometheus trigger.",
    )
    prometheus_address: PrometheusUrl | None = Field(
        default=None, description="Prometheus URL (http or https) for the KEDA trigger (driver keda)."
    )
    behavior: ScalingBehavior = Field(default_factory=ScalingBehavior, description="Scaling speed.")
    scale_to_zero: ScaleToZero = Field(
        default_factory=ScaleToZero,
        description="Idle period and request holding of minReplicas 0 (ignored above 0).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise field_error("minReplicas", f"{self.min_replicas} exceeds maxReplicas ({self.max_replicas})")
        if self.driver == "keda" and not self.prometheus_address:
            raise field_error("prometheusAddress", "driver keda needs prometheusAddress (the Prometheus URL)")
        if self.min_replicas == 0 and self.driver != "keda":
            raise field_error(
                "minReplicas",
                "minReplicas 0 needs driver: keda; the HPA cannot scale to zero (its HPAScaleToZero "
                "feature gate is alpha and off on managed clusters)",
            )
        return self

    @property
    def to_zero(self) -> bool:
        """The engines may go to zero replicas: the gateway holds requests while one starts."""
        return self.min_replicas == 0


class RateLimit(Model):
    """Per-API-key request rate limit (nginx limit_req)."""

    requests_per_minute: int = Field(default=600, ge=1, le=1_000_000, description="Sustained rate per key.")
    burst: int = Field(default=50, ge=0, le=100_000, description="Requests above the rate allowed at once.")


#: An API key's id: a data key of the API-key Secret, as run-nginx.sh accepts it.
KeyId = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._-]+$")]


class ModelAccess(Model):
    """API keys limited to some models. A key named in any rule may use the models of its rules and no
    other (403 otherwise); a key named in no rule may use every model."""

    api_keys: list[KeyId] = Field(
        min_length=1, max_length=256, description="Key ids: data keys of the API-key Secret."
    )
    models: list[ModelName] = Field(
        min_length=1,
        max_length=256,
        description="Models they may use: the base model's served name (spec.model.servedModelName, else "
        "spec.model.name; also what a request naming no model gets) and adapter names (spec.lora.adapters).",
    )


#: A QwenDeployment's name, as another's gateway names it (metadata.name rules: NAME_RULES below).
DeploymentName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")]
#: Saturation of a tier's router, per gateway pod, by default: vLLM's default batch (max_num_seqs 256).
DEFAULT_TIER_MAX_CONCURRENT = 256


class DeploymentRef(Model):
    """Another QwenDeployment in this namespace."""

    name: DeploymentName = Field(description="Its metadata.name.")


class GatewayTier(Model):
    """Another QwenDeployment of this namespace whose engines this gateway serves under their model name
    (docs/gateway.md, "Tiers"). The gateway reaches its engine pods directly, through a vllm-router of
    its own per tier; the tier's own gateway, if it has one, is not in the path."""

    name: ModelName = Field(
        description="What clients send as `model`: the tier's served model name (its "
        "spec.model.servedModelName, else spec.model.name; status.tiers says when they differ)."
    )
    deployment_ref: DeploymentRef = Field(description="The QwenDeployment serving it, in this namespace.")
    spill_to: ModelName | None = Field(
        default=None,
        description="Opt-in spill-over: a request for this tier that its router refuses for want of "
        "capacity (no ready engine: 503; maxConcurrentRequests in flight and queueSize waiting: 429) is "
        "sent to this model instead (another tier's name or the base model's served name), its `model` "
        "rewritten. Unset: such a request gets the JSON 503.",
    )
    max_concurrent_requests: int = Field(
        default=DEFAULT_TIER_MAX_CONCURRENT,
        ge=1,
        le=100_000,
        description="Requests each gateway pod passes to this tier's engines at once (its router's "
        "--max-concurrent-requests).",
    )
    queue_size: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="Requests each gateway pod holds waiting for this tier above maxConcurrentRequests; "
        "beyond them the tier is saturated (spill-over, else 503). 0: saturated as soon as "
        "maxConcurrentRequests are in flight.",
    )
    rate_limit: RateLimit | None = Field(
        default=None,
        description="Per-key rate limit on this tier's requests, enforced like spec.gateway.rateLimit "
        "(each pod its share) and on top of it. Unset: only the gateway's.",
    )
    engine_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="The key the tier's engines require (its spec.engine.apiKeySecret). Default: the "
        "Secret the operator generates for it, `<deploymentRef.name>-engine-key` (key `token`), which "
        "exists while the tier's own gateway is enabled; without that Secret no key is sent.",
    )


#: HTTP header names an alias rule may test (letters, digits, '-').
HeaderName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]


class HeaderMatch(Model):
    """A request header with an exact value."""

    name: HeaderName = Field(description="Header name (case-insensitive).")
    value: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^'\"$\\]*$")] = Field(
        description="Its exact value (case-sensitive)."
    )


class AliasRule(Model):
    """Where an alias sends a request for which every condition set here holds (none set: every request)."""

    model: ModelName = Field(
        description="The model it gets: a tier's name, the base model's or an adapter's."
    )
    max_prompt_bytes: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="The request body is at most this many bytes (about 4 bytes per token of English).",
    )
    header: HeaderMatch | None = Field(default=None, description="The request carries this header value.")
    tools: bool | None = Field(
        default=None, description="true: the request has a non-empty `tools` list; false: it has none."
    )
    images: bool | None = Field(
        default=None,
        description="true: a message has an image part (`image_url`, `input_image`); false: none has.",
    )
    api_keys: list[KeyId] = Field(
        default_factory=list, max_length=256, description="The request's API key is one of these key ids."
    )


class ModelAlias(Model):
    """A model name clients may send that names no engine: the gateway picks the model from the request
    (first matching rule, else `default`) and rewrites the request's `model` to it."""

    name: ModelName = Field(description="What clients send as `model`, e.g. `auto`.")
    rules: list[AliasRule] = Field(default_factory=list, max_length=16, description="Checked in order.")
    default: ModelName = Field(description="The model when no rule matches.")


class GatewayService(Model):
    """The client-facing Service."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(default="ClusterIP", description="Type.")
    port: int = Field(default=80, ge=1, le=65535, description="Service port.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations (e.g. cloud LB).")


class Ingress(Model):
    """An optional Ingress in front of the gateway Service."""

    host: str = Field(min_length=1, description="Host name.")
    class_name: str | None = Field(default=None, description="IngressClass.")
    tls_secret_name: str | None = Field(default=None, description="TLS Secret for the host.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")


class HttpRoute(Model):
    """An optional Gateway API HTTPRoute to the gateway Service. Skipped (condition ExposureReady=False)
    when the Gateway API CRDs are absent."""

    parent_refs: list[KubeObject] = Field(min_length=1, description="Gateways the route attaches to.")
    hostnames: list[str] = Field(default_factory=list, description="Host names.")


_ONE_TIER_PER_DEPLOYMENT = "two tiers name the same deploymentRef: one tier per deployment"
#: Messages of cross-field rules, each checked twice: by CEL in the API server, by a validator here.
_AUTH_NONE_KEYS = "auth none takes no apiKeysSecret: remove one of them"
_AUTH_NONE_ACCESS = "auth none has no API keys to limit: set auth apiKeys or remove modelAccess"
_REPLICAS_XOR_AUTOSCALING = "set either replicas or autoscaling, not both"
_ZERO_NEEDS_GATEWAY = (
    "autoscaling.minReplicas 0 needs the gateway, which holds requests while no engine is ready"
)
_SPILL_TO_ITSELF = "a tier's spillTo names another model than the tier itself"


class Gateway(Model):
    """The OpenAI-compatible endpoint in front of the engine replicas: nginx (keys, limits) + vllm-router."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # Names unique across tiers and aliases: their list-map keys; across the other kinds of
                # names (the base model, adapters): the operator (their lengths have no CEL-friendly bound).
                {
                    "rule": "!has(self.tiers) || self.tiers.all(t, "
                    "self.tiers.exists_one(u, u.deploymentRef.name == t.deploymentRef.name))",
                    "message": _ONE_TIER_PER_DEPLOYMENT,
                    "fieldPath": ".tiers",
                },
                {
                    "rule": "!has(self.tiers) || self.tiers.all(t, !has(t.spillTo) || t.spillTo != t.name)",
                    "message": _SPILL_TO_ITSELF,
                    "fieldPath": ".tiers",
                },
                {
                    "rule": "!(has(self.auth) && self.auth == 'none' && has(self.apiKeysSecret))",
                    "message": _AUTH_NONE_KEYS,
                    "fieldPath": ".apiKeysSecret",
                },
                {
                    "rule": "!(has(self.auth) && self.auth == 'none' && has(self.modelAccess) && "
                    "size(self.modelAccess) > 0)",
                    "message": _AUTH_NONE_ACCESS,
                    "fieldPath": ".modelAccess",
                },
            ]
        }
    )

    enabled: bool = Field(
        default=True, description="Deploy the gateway; off exposes only the engine Service."
    )
    replicas: int = Field(default=2, ge=1, le=100, description="Gateway pods.")
    policy: Literal[
        "cache_aware",
        "round_robin",
        "random",
        "power_of_two",
        "consistent_hash",
        "sticky_least_loaded",
        "kv_aware",
    ] = Field(
        default="consistent_hash",
        description="vllm-router routing policy. consistent_hash (default): the turns of a conversation "
        "(its X-Session-Id, else its first user message) go to one engine, which has its prefix cached; "
        "no extra work per request. sticky_least_loaded: the same stickiness, but a new conversation goes "
        "to the engine holding the fewest (kept 2 h per gateway pod) instead of where its hash falls. "
        "cache_aware: prefix- and load-aware, but each request first costs an extra call to an engine. "
        "round_robin, random, power_of_two: load only.",
    )
    auth: Literal["apiKeys", "none"] = Field(
        default="apiKeys",
        description="Client authentication. `apiKeys` (default): every request needs a key of "
        "apiKeysSecret, or of a Secret the operator generates when that is unset. `none`: the gateway "
        "accepts every request (only behind your own authenticating proxy).",
    )
    api_keys_secret: DnsName | None = Field(
        default=None,
        description="Secret whose every key is an API key id and value a key. Unset with auth `apiKeys`: "
        "the operator creates `<name>-gateway-api-keys` with one random key (id `default`) and never "
        "overwrites it; status.gateway.apiKeysSecret names the Secret in use.",
    )
    rate_limit: RateLimit = Field(default_factory=RateLimit, description="Per-key rate limit.")
    max_concurrent_requests: int | None = Field(
        default=None,
        ge=1,
        description="Requests passed to the engines at once (whole gateway). Default: what the engines "
        "can run and queue at their most replicas, in every gateway pod. With autoscaling a lower value "
        "is raised to that (a warning says so): the queue must reach the engines for the autoscaler to "
        "see it.",
    )
    queue_size: int = Field(
        default=256,
        ge=0,
        description="Requests waiting in the gateway once the pass-through limit is reached (whole "
        "gateway); beyond it: 503.",
    )
    queue_timeout_seconds: int = Field(default=30, ge=1, description="Longest wait for a slot.")
    request_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Longest request, streaming included. Default: the time to generate maxModelLen "
        "tokens at a conservative 20 tokens/s per stream, plus 2 minutes, in whole minutes (see the plan).",
    )
    connect_timeout_seconds: int = Field(default=5, ge=1, le=60, description="Connect timeout to an engine.")
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=15,
        le=86_400,
        description="Longest time a terminating gateway pod takes (rollout, node drain): 15 s to leave the "
        "Service and exit, the rest finishing its streams (status.plan.drainSeconds.gateway). Default: "
        "the request timeout, at most 600 s, plus 15 s; streams still running then are cut.",
    )
    model_access: list[ModelAccess] = Field(
        default_factory=list,
        max_length=64,
        description='API keys limited to some models (docs/gateway.md, "Limiting keys to models"): a key '
        "named here may use only the models of its rules and gets 403 for the others. Needs auth apiKeys. "
        "Empty: every key may use every model.",
    )
    tiers: list[GatewayTier] = Field(
        default_factory=list,
        max_length=8,
        description="Other QwenDeployments of this namespace served through this gateway, each under its "
        'model name (docs/gateway.md, "Tiers"); status.tiers reports each one\'s readiness.',
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    aliases: list[ModelAlias] = Field(
        default_factory=list,
        max_length=8,
        description="Model names whose requests the gateway sends to a model it picks by rules (e.g. "
        "`auto`: short prompts without tools to a small tier).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    image: Image | None = Field(default=None, description="Gateway image (nginx + vllm-router).")
    service: GatewayService = Field(default_factory=GatewayService, description="Client-facing Service.")
    ingress: Ingress | None = Field(default=None, description="Optional Ingress.")
    http_route: HttpRoute | None = Field(default=None, description="Optional Gateway API HTTPRoute.")

    @model_validator(mode="after")
    def _keys_need_auth(self) -> Gateway:
        if self.auth == "none" and self.api_keys_secret is not None:
            raise field_error("apiKeysSecret", _AUTH_NONE_KEYS)
        if self.auth == "none" and self.model_access:
            raise field_error("modelAccess", _AUTH_NONE_ACCESS)
        return self


class Monitoring(Model):
    """Prometheus Operator objects. Skipped (condition MonitoringReady=False) when their CRDs are absent."""

    service_monitor: bool = Field(default=True, description="ServiceMonitor for engines and gateway.")
    prometheus_rule: bool = Field(default=False, description="PrometheusRule with the alert rules.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels for Prometheus selectors.")
    interval: str = Field(default="15s", pattern=r"^[0-9]+(ms|s|m)$", description="Scrape interval.")


_PATH_NEEDS_CLAIM = (
    "an adapter in the model cache needs spec.model.cache.claimName: without it the cache is an emptyDir "
    "that starts empty; name a prefilled PersistentVolumeClaim there, or use source.huggingFace"
)


class QwenDeploymentSpec(Model):
    """Desired state of one Qwen3 serving deployment."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.replicas) && has(self.autoscaling))",
                    "message": _REPLICAS_XOR_AUTOSCALING,
                    "fieldPath": ".replicas",
                },
                {
                    "rule": "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || "
                    "self.autoscaling.minReplicas <= self.autoscaling.maxReplicas",
                    "message": "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
                    "fieldPath": ".autoscaling.minReplicas",
                },
                {
                    "rule": "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || "
                    "self.autoscaling.minReplicas > 0 || !has(self.gateway) || !has(self.gateway.enabled) || "
                    "self.gateway.enabled",
                    "message": _ZERO_NEEDS_GATEWAY,
                    "fieldPath": ".gateway.enabled",
                },
                {
                    "rule": "!has(self.lora) || !has(self.lora.adapters) || "
                    "!self.lora.adapters.exists(a, has(a.source.path)) || "
                    "(has(self.model.cache) && has(self.model.cache.claimName))",
                    "message": _PATH_NEEDS_CLAIM,
                    "fieldPath": ".lora.adapters",
                },
            ]
        }
    )

    model: ModelSource = Field(description="Checkpoint and weight source.")
    gpu: GpuPool = Field(description="GPU node pool.")
    parallelism: Parallelism = Field(default_factory=Parallelism, description="Parallelism per replica.")
    engine: Engine = Field(default_factory=Engine, description="vLLM engine settings.")
    lora: Lora | None = Field(
        default=None,
        description="LoRA adapters served beside the base model, each under its own model name "
        "(docs/lora.md). Unset: LoRA off.",
    )
    replicas: int | None = Field(default=None, ge=0, le=1000, description="Fixed replicas (default 1).")
    autoscaling: Autoscaling | None = Field(default=None, description="Queue-depth autoscaling.")
    gateway: Gateway = Field(default_factory=Gateway, description="Client-facing gateway.")
    monitoring: Monitoring = Field(default_factory=Monitoring, description="Prometheus integration.")
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets (type kubernetes.io/dockerconfigjson, in this namespace) the engine and "
        "gateway pods pull their images with, for private registries and mirrors.",
    )

    @model_validator(mode="after")
    def _replicas_xor_autoscaling(self) -> QwenDeploymentSpec:
        if self.replicas is not None and self.autoscaling is not None:
            raise field_error("replicas", _REPLICAS_XOR_AUTOSCALING)
        if self.scales_to_zero and not self.gateway.enabled:
            raise field_error(
                "gateway.enabled",
                _ZERO_NEEDS_GATEWAY,
            )
        return self

    @property
    def scales_to_zero(self) -> bool:
        """autoscaling.minReplicas is 0: the gateway runs the activator that holds requests."""
        return self.autoscaling is not None and self.autoscaling.to_zero

    @property
    def served_model_name(self) -> str:
        """The name clients send for the base model."""
        return self.model.served_model_name or self.model.name

    @model_validator(mode="after")
    def _adapters_beside_the_model(self) -> QwenDeploymentSpec:
        # Not a CEL rule: model.name and servedModelName have no maxLength, so comparing them with every
        # adapter's name has no cost bound the API server would accept.
        adapters = self.lora.adapters if self.lora else []
        for i, adapter in enumerate(adapters):
            if adapter.name == self.served_model_name:
                raise field_error(
                    f"lora.adapters[{i}].name",
                    f"{adapter.name!r} is the base model's served name (spec.model.servedModelName, else "
                    "spec.model.name): requests for it would reach the base model, and vLLM refuses to "
                    "load an adapter of that name; choose another",
                )
            if adapter.source.path is not None and self.model.cache.claim_name is None:
                raise field_error(f"lora.adapters[{i}].source.path", _PATH_NEEDS_CLAIM)
        return self

    @property
    def model_names(self) -> list[str]:
        """Every name a request may send in `model`: the base model's, then the adapters'."""
        return [self.served_model_name, *(a.name for a in (self.lora.adapters if self.lora else []))]

    @property
    def tier_names(self) -> list[str]:
        return [t.name for t in self.gateway.tiers]

    @property
    def alias_names(self) -> list[str]:
        return [a.name for a in self.gateway.aliases]

    @property
    def routable_names(self) -> list[str]:
        """Every name the gateway routes by: the base model's, the adapters', the tiers', the aliases'."""
        return [*self.model_names, *self.tier_names, *self.alias_names]

    @model_validator(mode="after")
    def _one_name_one_model(self) -> QwenDeploymentSpec:
        # Adapters, tiers and aliases share one namespace of model names with the base model: a request
        # names exactly one of them.
        seen: dict[str, str] = {name: "the base model's served name" for name in self.model_names[:1]}
        seen.update({a: "an adapter's name (spec.lora.adapters)" for a in self.model_names[1:]})
        named = [
            *(
                (f"gateway.tiers[{i}].name", t.name, "a tier's name")
                for i, t in enumerate(self.gateway.tiers)
            ),
            *((f"gateway.aliases[{i}].name", a.name, "an alias") for i, a in enumerate(self.gateway.aliases)),
        ]
        for path, name, what in named:
            if name in seen:
                raise field_error(
                    path, f"{name!r} is also {seen[name]}: a request names one model, so names must be unique"
                )
            seen[name] = what
        refs: dict[str, int] = {}
        for i, tier in enumerate(self.gateway.tiers):
            ref = tier.deployment_ref.name
            if ref in refs:
                raise field_error(
                    f"gateway.tiers[{i}].deploymentRef.name",
                    f"{ref!r} is also the deployment of tiers[{refs[ref]}]: one tier per deployment",
                )
            refs[ref] = i
        if self.gateway.tiers and not self.gateway.enabled:
            raise field_error("gateway.tiers", "tiers are served by this deployment's gateway: enable it")
        engines = [self.served_model_name, *self.model_names[1:], *self.tier_names]
        spilling = {t.name for t in self.gateway.tiers if t.spill_to is not None}
        for i, tier in enumerate(self.gateway.tiers):
            if tier.spill_to is None:
                continue
            others = [n for n in [self.served_model_name, *self.tier_names] if n != tier.name]
            if tier.spill_to not in others:
                raise field_error(
                    f"gateway.tiers[{i}].spillTo",
                    f"{tier.spill_to!r} is not another tier's name or the base model's served name; "
                    f"choose one of: {', '.join(others)}",
                )
            if tier.spill_to in spilling:
                # one step only: a chain could send a request round in a circle
                raise field_error(
                    f"gateway.tiers[{i}].spillTo",
                    f"{tier.spill_to!r} spills over itself; a tier spills to a tier without spillTo or to "
                    "the base model",
                )
        for i, alias in enumerate(self.gateway.aliases):
            targets = [(f"gateway.aliases[{i}].rules[{j}].model", r.model) for j, r in enumerate(alias.rules)]
            for path, target in [*targets, (f"gateway.aliases[{i}].default", alias.default)]:
                if target not in engines:
                    raise field_error(
                        path,
                        f"{target!r} is not a model this gateway serves (an alias picks the base model, an "
                        f"adapter or a tier); choose one of: {', '.join(engines)}",
                    )
        return self

    @model_validator(mode="after")
    def _access_to_known_models(self) -> QwenDeploymentSpec:
        known = self.routable_names
        for i, rule in enumerate(self.gateway.model_access):
            for j, model in enumerate(rule.models):
                if model not in known:
                    raise field_error(
                        f"gateway.modelAccess[{i}].models[{j}]",
                        f"{model!r} is neither the base model's served name nor an adapter's name, nor a "
                        f"tier's or an alias's; this gateway serves: {', '.join(known)}",
                    )
        return self

    @property
    def effective_replicas(self) -> int:
        return 1 if self.replicas is None else self.replicas


#: What a Deployment's pods add to its name: `-<pod-template-hash>-<random>`, a hash of up to 10
#: characters (32 bits in decimal, safe-encoded) and 5 random ones.
POD_NAME_SUFFIX = len("-0123456789-abcde")
#: The longest metadata.name whose children's names all keep within the 63-character DNS label limit.
#: The longest child name is a gateway pod, `<name>-gateway` (names.py) plus POD_NAME_SUFFIX: past it
#: the API server cuts the generated pod names and the hash that tells the pods of a rollout's two
#: ReplicaSets apart is lost. tests/test_spec.py renders every child to check that this is exact.
MAX_NAME_LENGTH = 63 - len("-gateway") - POD_NAME_SUFFIX
NAME_RULES = (
    StringRule(
        f"^.{{0,{MAX_NAME_LENGTH}}}$",
        f"at most {MAX_NAME_LENGTH} characters, so that the name of every child keeps within the "
        "63-character DNS label limit (the longest is a gateway pod, "
        "<name>-gateway-<pod-template-hash>-<5 characters>); choose a shorter name",
    ),
    StringRule(
        "^[a-z]([-a-z0-9]*[a-z0-9])?$",
        "lowercase letters, digits and '-', starting with a letter and ending with a letter or digit "
        "(a DNS-1035 label: the client Service takes this name); choose another name",
    ),
)


class ObjectMeta(BaseModel):
    """The parts of metadata the operator reads."""

    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, checked_by(NAME_RULES)] = Field(min_length=1)
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class QwenDeployment(BaseModel):
    """A parsed QwenDeployment: metadata plus typed spec."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["inference.qwenops.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["QwenDeployment"]
    metadata: ObjectMeta
    spec: QwenDeploymentSpec

    @model_validator(mode="after")
    def _tiers_are_others(self) -> QwenDeployment:
        for i, tier in enumerate(self.spec.gateway.tiers):
            if tier.deployment_ref.name == self.metadata.name:
                raise field_error(
                    f"spec.gateway.tiers[{i}].deploymentRef.name",
                    f"{self.metadata.name!r} is this deployment: its engines serve the base model already; "
                    "a tier names another QwenDeployment",
                )
        return self


class SpecError(ValueError):
    """Invalid input, as a list of (field path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in problems))


#: Tags pydantic puts in error locations below a discriminated union (`speculative.<method>.<field>`).
_UNION_TAGS = {"speculative": ("ngram", "draft_model", "eagle3")}


def field_path(loc: tuple[int | str, ...]) -> str:
    """`('spec', 'engine', 'extraArgs', 2)` -> `spec.engine.extraArgs[2]`; drops union tags."""
    out = ""
    previous: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _UNION_TAGS.get(str(previous), ()) or part.startswith("function-"):
            continue
        else:
            out += f".{part}" if out else part
        previous = part
    return out


def parse(body: dict[str, Any]) -> QwenDeployment:
    """Parse a whole resource; raise SpecError naming each bad field."""
    try:
        return QwenDeployment.model_validate(body)
    except ValidationError as exc:
        raise SpecError([_problem(e) for e in exc.errors()]) from None


def _problem(error: Any) -> tuple[str, str]:
    path = field_path(error["loc"])
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "field_rule":
        return f"{path}.{ctx['field']}" if path else ctx["field"], ctx["message"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = ctx.get("discriminator", "").strip("'")
        if kind == "union_tag_not_found":
            return f"{path}.{tag}", "required field is missing"
        return f"{path}.{tag}", f"must be one of {ctx['expected_tags']}, not {ctx['tag']!r}"
    if kind == "extra_forbidden":
        return path or "(root)", "unknown field"
    if kind == "missing":
        return path or "(root)", "required field is missing"
    return path or "(root)", str(error["msg"]).removeprefix("Value error, ")
