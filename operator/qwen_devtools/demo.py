"""`make demo`: a dev cluster whose real node serves a QwenDeployment through the operator's own objects,
beside simulated (kwok) GPU node pools, ending with a chat completion through the gateway.

    python -m qwen_devtools.demo up | down

Everything that answers is real: the operator runs as a pod from its image (installed with the chart),
the gateway pod (nginx + vllm-router) and the vLLM engine (the CPU build, TP 2, a tiny random model
served as Qwen/Qwen3-32B from a model cache PVC) run on the real node. The kwok nodes only take part in
scheduling (they run no containers).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from . import serving
from .devcluster import cluster as devcluster
from .devcluster import realnode
from .repo import REPO

DESCRIPTION = "A dev cluster whose real node serves Qwen through the operator, with simulated GPU pools."
NAME = "demo"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def up() -> int:
    started = time.monotonic()
    if realnode.holder() == realnode.TESTS_CLUSTER:
        step(
            f"the tests' cluster {realnode.TESTS_CLUSTER!r} still holds this machine's real node: stopping it"
        )
        devcluster.down(realnode.TESTS_CLUSTER)
    step("dev cluster with the real node and simulated GPU pools (binaries built by `make setup-demo`)")
    handle = devcluster.up(NAME, real_node=True)
    step("images: operator, gateway, CPU vLLM engine (built here once, cached by content) into the node")
    serving.load_images(NAME)
    step("the operator, installed with its Helm chart (a pod from its image, restricted Pod Security)")
    serving.install_operator(handle)
    body = serving.dev_qwendeployment()
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    step(f"namespace {ns}: model cache PVC with the tiny model, an API key for the gateway")
    serving.prepare_namespace(handle, ns)
    serving.model_cache(handle, ns, body["spec"]["model"]["cache"]["claimName"])
    key = serving.api_key_secret(handle, ns, body["spec"]["gateway"]["apiKeysSecret"])
    cr = serving.DEV_CR.relative_to(REPO)
    step(f"capacity plan of {cr} (qwen-operator plan, offline)")
    subprocess.run([sys.executable, "-m", "qwen_operator.cli", "plan", "-f", str(serving.DEV_CR)], check=True)
    step(f"kubectl apply -f {cr}; waiting until the engine passes its readiness probe")
    serving.apply(handle, body)
    serving.wait_serving(handle, ns, name)
    url = serving.service_url(handle, ns, name)
    step(f"a chat completion through the gateway Service {url} with the API key")
    status, answer = serving.chat(url, key, "Hello! Who are you?")
    if status != 200:
        print(f"the gateway answered {status}: {answer}", file=sys.stderr)
        return 1
    message = answer["choices"][0]["message"]
    # The qwen3 reasoning parser files text before a </think> under "reasoning"; random weights
    # rarely close the think block, so the answer is usually all reasoning.
    text = message.get("content") or message.get("reasoning") or message.get("reasoning_content")
    print(f"answer ({answer['usage']['completion_tokens']} tokens of random text from the tiny model, "
          f"served by {answer.get('system_fingerprint')}): {text!r}")  # fmt: skip
    step("kubectl get qwd -A -o wide")
    print(handle.kubectl("get", "qwd", "-A", "-o", "wide").stdout)
    step("nodes: the real node and the simulated GPU pools")
    print(
        handle.kubectl(
            "get", "nodes", "-o",
            "custom-columns=NAME:.metadata.name,PRODUCT:.metadata.labels.nvidia\\.com/gpu\\.product,"
            "GPUS:.status.capacity.nvidia\\.com/gpu,SIMULATED:.metadata.annotations.kwok\\.x-k8s\\.io/node",
        ).stdout
    )  # fmt: skip
    step(f"pods in {ns} and {serving.OPERATOR_NAMESPACE}")
    print(handle.kubectl("get", "pods", "-n", ns, "-o", "wide").stdout)
    print(handle.kubectl("get", "pods", "-n", serving.OPERATOR_NAMESPACE, "-o", "wide").stdout)
    print(f"demo ready in {time.monotonic() - started:.0f}s. Try it yourself:\n")
    print(f"  export KUBECONFIG={handle.kubeconfig}")
    print(f"  {serving.curl_command(url, key)}\n")
    print("Stop everything with: make demo-down")
    return 0


def down() -> int:
    devcluster.down(NAME)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen_devtools.demo", description=DESCRIPTION)
    parser.add_argument("command", choices=["up", "down"])
    return up() if parser.parse_args().command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
