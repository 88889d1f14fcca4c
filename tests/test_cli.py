"""`qwen-operator plan`, `render` and `crd`: run in this process (support.cli_in_process, the same
result as the console script), and a few times as the installed console script itself (its exit status,
stdin, and that plan, render and crd start without the kubernetes client and kopf).

Golden files: tests/golden/plan/<example>.json hold the `plan -o json` output of each example; rewrite
them with `pytest --update-golden` (or UPDATE_GOLDEN=1) and review the diff.

The bad-resource corpus: tests/bad-crs/NN-name.yaml, each starting with
    # expect: <field path>: <message substring>
and, when the API server's schema or CEL rules catch it too (e2e/test_crd.py checks that),
    # server: rejects: <field path>: <message substring>
Its Python-side checks are all here, one test per file: `plan` and `render` refuse it naming the field,
and the status the operator would write refuses it in the right condition.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from qwen_operator.api.crd import crd
from qwen_operator.api.engine import OWNED_FLAGS, REFUSED_FLAGS, REFUSED_VALUES
from qwen_operator.api.review import review
from qwen_operator.api.spec import OPERATOR_ENV, QwenDeploymentSpec, SpecError
from qwen_operator.status import Observed, compute_status
from support import (
    BAD_CRS,
    EXAMPLES,
    GOLDEN,
    REPO,
    BadCr,
    bad_cr,
    cli_in_process,
    example,
    load,
    run_cli,
)

PLAN_KEYS = {
    "fits",
    "tensorParallelSize",
    "gpusPerReplica",
    "weightsGiBPerGpu",
    "loraGiBPerGpu",
    "kvBytesPerToken",
    "kvTokensPerReplica",
    "maxModelLen",
    "maxConcurrentAtMaxModelLen",
    "engineArgs",
    "warnings",
    "errors",
}


# --- plan on the examples: golden files ------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_plan_json_matches_golden(path: Path, update_golden: bool) -> None:
    result = cli_in_process("plan", "-f", str(path), "-o", "json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    golden = GOLDEN / "plan" / f"{path.stem}.json"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(result.stdout)
    assert golden.exists(), f"{golden} is missing: run pytest --update-golden"
    assert json.loads(result.stdout) == json.loads(golden.read_text()), (
        "run pytest --update-golden if intended"
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_plan_json_has_the_documented_keys(path: Path) -> None:
    plan = json.loads((GOLDEN / "plan" / f"{path.stem}.json").read_text())
    assert set(plan) >= PLAN_KEYS
    assert plan["fits"] is True and plan["errors"] == []
    assert plan["engineArgs"] == review(load(path)).command


def test_a100_golden_numbers_by_hand() -> None:
    plan = json.loads((GOLDEN / "plan" / "a100-80gb-tp2-bf16.json").read_text())
    # bf16 weights 65.53e9 B / 2 GPUs = 32.765e9 B = 30.51 GiB per GPU
    assert plan["weightsGiBPerGpu"] == 30.51
    # usable: 79.14 GiB (what CUDA reports for an A100-80GB) x 0.9 = 76,478,335,156 B; minus per GPU
    # 32,765,000,000 B weights, the profile forward of 8,192 batched tokens at TP 2 (117,768 B per token,
    # tools/measure/activation_peak.out.txt) 964,755,456 B, the sampler state of 128 requests 128 x 4 x
    # 165,914 = 84,947,968 B, workspaces 33 MiB = 34,603,008 B, non-torch 68 MiB = 71,303,168 B
    # (tools/measure/runtime_terms) and CUDA graphs 1.86 GiB = 1,997,159,792 B: 40,560,565,763 B = 37.77 GiB
    assert plan["kvCacheGiBPerGpu"] == 37.77
    # 964,755,456 + 84,947,968 + 34,603,008 + 71,303,168 + 1,997,159,792 = 3,152,769,392 B
    assert plan["runtimeGiBPerGpu"] == 2.94
    # KV per token 2 (K,V) x 64 layers x 8 KV heads x 128 head_dim x 2 B = 262,144 B
    assert plan["kvBytesPerToken"] == 262_144
    # tokens = budget x 2 GPUs / 262,144 = 309,453.0, in whole 16-token blocks -> 309,440
    assert plan["kvTokensPerReplica"] == 309_440
    # 309,440 // 32,768 = 9 requests of the full 32K context at once
    assert plan["maxConcurrentAtMaxModelLen"] == 9
    assert (plan["tensorParallelSize"], plan["gpusPerReplica"], plan["maxModelLen"]) == (2, 2, 32_768)


def test_plan_table_output() -> None:
    result = cli_in_process("plan", "-f", str(EXAMPLES[0]))
    assert result.returncode == 0, result.stderr
    lines = dict(line.split("  ", 1) for line in result.stdout.splitlines() if "  " in line)
    assert lines["Fits"].strip() == "yes"
    assert lines["KV bytes per token"].strip() == "262,144"
    # maxModelLen 32,768 at 20 tokens/s + 120 s, in whole minutes (plan.request_timeout_seconds)
    assert lines["Gateway request timeout"].strip() == "1800 s"
    planned = json.loads(cli_in_process("plan", "-f", str(EXAMPLES[0]), "-o", "json").stdout)
    assert lines["KV tokens per replica"].strip() == f"{planned['kvTokensPerReplica']:,}"
    assert lines["Longest prefill step"].strip() == f"~{planned['prefillStepSeconds']:.1f} s"
    assert "Engine: vllm serve Qwen/Qwen3-32B --served-model-name" in result.stdout


def test_plan_shows_the_lora_term() -> None:
    body = example("a100-80gb-tp2-bf16")
    source = {"huggingFace": {"repo": "my-org/sql-lora", "revision": "0" * 40}}
    body["spec"]["lora"] = {"maxLoras": 4, "maxLoraRank": 64, "adapters": [{"name": "sql", "source": source}]}
    result = cli_in_process("plan", "-f", "-", stdin=yaml.safe_dump(body))
    assert result.returncode == 0, result.stderr
    lines = {
        k: v.strip() for k, v in (line.split("  ", 1) for line in result.stdout.splitlines() if "  " in line)
    }
    # test_plan.py test_lora_worked_example_by_hand: 2,895,511,552 B of slots (2.70 GiB), 2.80 GiB in all
    assert (
        lines["LoRA per GPU"]
        == "2.80 GiB (slots 4 x rank 64: 2.70 GiB; buffers and extra CUDA graphs 0.10 GiB)"
    )
    assert lines["LoRA adapters"] == "1 (held in host memory: 4)"
    planned = json.loads(cli_in_process("plan", "-f", "-", "-o", "json", stdin=yaml.safe_dump(body)).stdout)
    assert planned["loraGiBPerGpu"] == 2.8
    assert json.loads((GOLDEN / "plan" / "a100-80gb-tp2-bf16.json").read_text())["loraGiBPerGpu"] is None


def test_plan_table_quotes_json_arguments() -> None:
    result = cli_in_process("plan", "-f", str(next(p for p in EXAMPLES if "128k" in p.name)))
    assert result.returncode == 0
    assert "(YaRN x4)" in result.stdout
    assert '--hf-overrides \'{"max_position_embeddings":131072,' in result.stdout


def test_plan_reads_stdin_and_every_document() -> None:
    text = "\n---\n".join(path.read_text() for path in EXAMPLES)
    result = cli_in_process("plan", "-f", "-", "-o", "json", stdin=text)
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)
    assert [p["model"] for p in plans] == [load(path)["spec"]["model"]["name"] for path in EXAMPLES]


def test_plan_of_a_spec_that_does_not_fit_prints_the_plan_and_fails() -> None:
    path = next(p for p in BAD_CRS if p.name.startswith("03-"))
    result = cli_in_process("plan", "-f", str(path), "-o", "json")
    assert result.returncode == 1
    plan = json.loads(result.stdout)
    assert plan["fits"] is False and plan["engineArgs"] == []
    assert plan["errors"] == [
        line.split(": QwenDeployment bad-03: ", 1)[1] for line in result.stderr.splitlines()
    ]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["plan", "-f", "/nonexistent.yaml"], None, "error: /nonexistent.yaml: No such file or directory"),
        (
            ["render", "-f", "-"],
            "kind: Deployment\napiVersion: apps/v1\n",
            "error: -: no QwenDeployment in the file",
        ),
        (["plan", "-f", "-"], "a: [b\n", "error: -: not valid YAML"),
        (["plan", "-f", "-"], "", "error: -: no QwenDeployment in the file"),
        (["plan"], None, "error: the following arguments are required: -f/--file"),
    ],
)
def test_usage_errors_exit_2(args: list[str], stdin: str | None, message: str) -> None:
    result = cli_in_process(*args, stdin=stdin)
    assert result.returncode == 2
    assert message in result.stderr


def test_render_examples() -> None:
    for path in EXAMPLES:
        result = cli_in_process("render", "-f", str(path))
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
        objects = [o for o in yaml.safe_load_all(result.stdout) if o]
        command = review(load(path)).command
        containers = [
            c
            for o in objects
            if o["kind"] == "Deployment"
            for c in o["spec"]["template"]["spec"]["containers"]
        ]
        assert [c["command"] + c["args"] for c in containers if "command" in c and "args" in c].count(
            command
        ) == 1


# --- the bad-resource corpus -----------------------------------------------------------------------


def test_the_corpus_is_large_enough() -> None:
    assert len(BAD_CRS) >= 60
    assert len({p.name[:2] for p in BAD_CRS}) == len(BAD_CRS), "numbers must be unique"
    expected = [(bad_cr(p).field, bad_cr(p).message) for p in BAD_CRS]
    assert len(set(expected)) == len(expected), "two files expect the same problem"


#: A field path in a message: `spec.engine.maxModelLen`, `spec.engine.env[1].name`.
_SPEC_PATH = re.compile(r"\bspec(?:\.[A-Za-z]+(?:\[\d+\])?)+")


def _spec_field_exists(path: str) -> bool:
    """Whether `spec.a.b` names a field of the QwenDeployment spec (camelCase, list indexes allowed);
    below a free-form Kubernetes object (an env entry, a toleration) any key is taken as given."""
    models: list[type[BaseModel]] = [QwenDeploymentSpec]
    for part in re.sub(r"\[\d+\]", "", path).split(".")[1:]:
        if not models:
            return True
        fields = [f for m in models for f in m.model_fields.values() if f.alias == part]
        if not fields:
            return False
        models = [m for f in fields for m in _models_in(f.annotation)]
    return True


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (Optional, lists, unions, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


_ERROR_LINE = re.compile(r"^error: .*?: QwenDeployment \S+: (?P<path>\S+): (?P<message>.*)$")


def _messages_of_the_refusal_tables() -> list[str]:
    owned = [o.message(flag) for flag, o in OWNED_FLAGS.items()]
    return (
        owned
        + list(REFUSED_FLAGS.values())
        + list(REFUSED_VALUES.values())
        + [f"{name}: {field}" for name, field in OPERATOR_ENV.items() if field]
    )


def test_every_field_a_message_names_is_a_real_spec_path(
    corpus_results: dict[tuple[str, str], subprocess.CompletedProcess[str]],
) -> None:
    errors = [
        m for r in corpus_results.values() for line in r.stderr.splitlines() if (m := _ERROR_LINE.match(line))
    ]
    own = {e["path"] for e in errors if e["message"] != "unknown field" and e["path"].startswith("spec.")}
    texts = [e["message"] for e in errors] + _messages_of_the_refusal_tables()
    named = {m for text in texts for m in _SPEC_PATH.findall(text)}
    assert len(own) >= 25 and len(named) >= 20  # the corpus and the tables reach most fields
    assert [p for p in sorted(own | named) if not _spec_field_exists(p)] == []
    assert not _spec_field_exists("spec.engine.port") and _spec_field_exists("spec.engine.speculative.model")


@pytest.fixture(scope="module")
def corpus_results() -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """`plan` and `render` on every corpus file, once."""
    return {
        (path.name, command): cli_in_process(command, "-f", str(path))
        for path in BAD_CRS
        for command in ("plan", "render")
    }


def _names_field(stderr: str, case: BadCr) -> bool:
    """Some error line names the field path and, after it, says the expected message."""
    for line in stderr.splitlines():
        at = line.find(f": {case.field}: ")
        if line.startswith("error: ") and at >= 0 and case.message in line[at:]:
            return True
    return False


#: The corpus files that are valid specs too large for their GPU pool; every other one breaks a rule.
CAPACITY_CASES = {
    "03-bf16-on-two-a100-40gb",
    "04-bf16-tp1-full-context-does-not-fit",
    "29-tp-times-pp-over-gpus-per-node",
    "63-weights-do-not-fit-one-a10",
}


def _status(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The conditions, by type, of the status the reconciler writes before it creates anything
    (reconcile._reconcile)."""
    try:
        observed = Observed(generation=1, review=review(body))
    except SpecError as exc:
        observed = Observed(generation=1, spec_errors=[f"{p}: {m}" for p, m in exc.problems])
    status = compute_status(observed, None, datetime(2026, 1, 1, tzinfo=UTC))
    return {c["type"]: c for c in status["conditions"]}


@pytest.mark.parametrize("path", BAD_CRS, ids=lambda p: p.stem)
def test_bad_resource_is_refused(
    path: Path, corpus_results: dict[tuple[str, str], subprocess.CompletedProcess[str]]
) -> None:
    case = bad_cr(path)
    for command in ("plan", "render"):
        result = corpus_results[(path.name, command)]
        assert result.returncode == 1, (
            f"{command}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
        assert _names_field(result.stderr, case), (
            f"{command}: want '{case.field}: ...{case.message}' in:\n{result.stderr}"
        )
    assert corpus_results[(path.name, "render")].stdout == "", (
        "nothing may be rendered from an invalid resource"
    )

    conditions = _status(load(path))
    refusing, other = (
        ("CapacityFit", "ConfigValid") if path.stem in CAPACITY_CASES else ("ConfigValid", "CapacityFit")
    )
    c = conditions[refusing]
    assert c["status"] == "False", list(conditions.values())
    assert f"{case.field}: " in c["message"] and case.message in c["message"]
    assert conditions[other]["status"] != "False"
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == (
        "False",
        "DoesNotFit" if refusing == "CapacityFit" else "InvalidSpec",
    )


# --- the console script itself: a few real processes -----------------------------------------------


def test_console_script_prints_what_main_prints() -> None:
    args = ("plan", "-f", str(EXAMPLES[0]), "-o", "json")
    script = run_cli(*args)
    assert script.returncode == 0, script.stderr
    here = cli_in_process(*args)
    assert (script.returncode, script.stdout, script.stderr) == (here.returncode, here.stdout, here.stderr)


def test_console_script_reads_stdin_and_one_bad_document_fails_the_file() -> None:
    text = EXAMPLES[0].read_text() + "\n---\n" + (BAD_CRS[0]).read_text()
    result = run_cli("plan", "-f", "-", stdin=text)
    assert result.returncode == 1
    assert "error: -: QwenDeployment bad-01: spec.parallelism.tensor: " in result.stderr
    assert "Fits" in result.stdout  # the valid document is still planned


def test_console_script_exits_2_on_a_usage_error() -> None:
    result = run_cli("plan", "-f", "/nonexistent.yaml")
    assert (result.returncode, result.stdout) == (2, "")
    assert "error: /nonexistent.yaml: No such file or directory" in result.stderr


#: In a fresh interpreter: plan, render and crd, then the top-level packages of kubernetes and kopf that
#: are loaded; then the same after parsing `run` (whose flags come from `leader`, which needs the client).
_IMPORTS_OF_THE_OFFLINE_COMMANDS = """
import contextlib, io, sys
from qwen_operator import cli
for args in (["plan", "-f", sys.argv[1]], ["render", "-f", sys.argv[1]], ["crd"]):
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(args) == 0, args
loaded = lambda: sorted({name.split(".")[0] for name in sys.modules} & {"kubernetes", "kopf"})
print(loaded())
cli.parser().parse_args(["run", "--leader-elect-lease-duration", "20"])  # run's flags need no client
print(loaded())
from qwen_operator import leader  # the election does: the check sees it
print(loaded())
"""


def test_plan_render_and_crd_import_neither_kubernetes_nor_kopf() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_OF_THE_OFFLINE_COMMANDS, str(EXAMPLES[0])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]", "['kubernetes']"]


# --- the CRD ---------------------------------------------------------------------------------------


def test_crd_command_prints_the_crd() -> None:
    """What `qwen-operator crd` prints is the CRD of the pydantic model (the checked-in file's
    freshness is `make verify`'s drift check)."""
    result = cli_in_process("crd")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout) == crd()


def test_crd_is_a_valid_custom_resource_definition() -> None:
    kubernetes_validate.validate(crd(), kubernetes_validate.latest_version(), strict=True)


def test_crd_schema_is_structural() -> None:
    """No $ref/anyOf/oneOf/default left; every object node says what it holds."""

    def walk(node: object, path: str) -> None:
        if isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{path}[{i}]")
            return
        if not isinstance(node, dict):
            return
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "default", "const", "$defs", "title"):
            assert banned not in node, f"{path}: {banned}"
        if "exclusiveMinimum" in node or "exclusiveMaximum" in node:
            assert all(
                isinstance(node.get(k, True), bool) for k in ("exclusiveMinimum", "exclusiveMaximum")
            ), path
        if node.get("type") == "object" and path != ".metadata":  # the API server owns metadata's schema
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields")
            ), path
        for key, child in node.items():
            if key == "properties":
                for name, prop in child.items():
                    walk(prop, f"{path}.{name}")
            elif key != "x-kubernetes-validations":
                walk(child, f"{path}/{key}")

    walk(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")


def test_crd_cel_rules() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    top = {r["fieldPath"]: r["message"] for r in spec["x-kubernetes-validations"]}
    assert top[".replicas"] == "set either replicas or autoscaling, not both"
    assert (
        top[".autoscaling.minReplicas"] == "autoscaling.minReplicas must not exceed autoscaling.maxReplicas"
    )
    autoscaling = {
        r["fieldPath"]: r["rule"] for r in spec["properties"]["autoscaling"]["x-kubernetes-validations"]
    }
    assert "keda" in autoscaling[".prometheusAddress"]
    speculative = spec["properties"]["engine"]["properties"]["speculative"]
    assert speculative["properties"]["method"]["enum"] == ["ngram", "draft_model", "eagle3"]
    messages = [r["message"] for r in speculative["x-kubernetes-validations"]]
    assert (
        "method ngram accepts only: method, numSpeculativeTokens, promptLookupMax, promptLookupMin"
        in messages
    )
    assert "method draft_model needs model" in messages
    assert "promptLookupMin must not exceed promptLookupMax" in messages
