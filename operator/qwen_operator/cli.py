"""`qwen-operator`: run the operator or its sidecars (lora-sync, activator), or plan and render
QwenDeployments offline.

Planning and rendering serve reviews, GitOps and CI; they (and `crd`) import neither the kubernetes
client nor kopf, which load only in the commands that talk to a cluster.

Exit codes: 0 valid and fits; 1 invalid or does not fit (each error on stderr as `path: reason`);
2 usage errors (unreadable file, not a QwenDeployment).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from .api.catalog import GIB
from .api.coldstart import HOLD_RETRY_AFTER_SECONDS
from .api.crd import crd
from .api.engine import ENGINE_PORT
from .api.lorafile import DESIRED_FILE, SIDECAR_PORT
from .api.review import Review, review
from .api.spec import KIND, SpecError
from .gateway.wiring import POD
from .lease import LEASE_NAME, LEASE_SECONDS, LOST_EXIT_CODE, RENEW_DEADLINE_SECONDS, RETRY_SECONDS, Timing

if TYPE_CHECKING:
    from .leader import Election

EXIT_INVALID = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Input that is not a QwenDeployment at all."""


def _documents(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    stream: TextIO
    try:
        stream = sys.stdin if path == "-" else Path(path).open(encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    with stream:
        try:
            docs = [d for d in yaml.safe_load_all(stream) if d is not None]
        except yaml.YAMLError as exc:
            raise UsageError(f"{path}: not valid YAML: {exc}") from None
    found = False
    for i, doc in enumerate(docs):
        if isinstance(doc, dict) and doc.get("kind") == KIND:
            found = True
            name = (doc.get("metadata") or {}).get("name", f"document {i}")
            yield f"{path}: {KIND} {name}", doc
    if not found:
        raise UsageError(f"{path}: no {KIND} in the file")


def _review_all(path: str) -> tuple[list[Review], list[str], list[dict[str, Any]]]:
    """Reviews of the resources that parse, every error line, and JSON stubs for those that do not."""
    reviews: list[Review] = []
    errors: list[str] = []
    invalid: list[dict[str, Any]] = []
    for label, doc in _documents(path):
        try:
            r = review(doc)
        except SpecError as exc:
            errors += [f"{label}: {p}: {m}" for p, m in exc.problems]
            invalid.append(
                {"fits": False, "resource": label, "errors": [f"{p}: {m}" for p, m in exc.problems]}
            )
            continue
        errors += [f"{label}: {p}: {m}" for p, m in r.plan.errors]
        reviews.append(r)
    return reviews, errors, invalid


def _table(r: Review) -> str:
    d = r.plan_dict()
    q = r.resource
    rows = [
        ("Resource", f"{q.metadata.namespace}/{q.metadata.name}"),
        ("Fits", "yes" if d["fits"] else "NO"),
        ("Model", f"{d['model']} ({d['quantization']}, KV {d['kvCacheDtype']})"),
        (
            "GPU",
            f"{d['gpu']} x {d['gpusPerReplica']} per replica (TP {d['tensorParallelSize']}, "
            f"PP {d['pipelineParallelSize']})",
        ),
        ("GPU nodes", d["nodeSelection"]),
        ("Weights per GPU", f"{d['weightsGiBPerGpu']} GiB"),
        (
            "Runtime memory per GPU",
            f"{d['runtimeGiBPerGpu']} GiB (profile peak, sampler state, workspaces, non-torch, CUDA graphs)",
        ),
        *_lora_rows(r),
        ("KV cache per GPU", f"{d['kvCacheGiBPerGpu']} GiB"),
        ("KV bytes per token", f"{d['kvBytesPerToken']:,}"),
        ("KV tokens per replica", f"{d['kvTokensPerReplica']:,}"),
        (
            "Context (maxModelLen)",
            f"{d['maxModelLen']:,}" + (f" (YaRN x{d['yarnFactor']:g})" if d["yarnFactor"] else ""),
        ),
        ("Full-context requests at once", str(d["maxConcurrentAtMaxModelLen"])),
        (
            "Longest prefill step",
            "unknown (no TFLOP/s figure for this GPU)"
            if d["prefillStepSeconds"] is None
            else f"~{d['prefillStepSeconds']:.1f} s",
        ),
        ("Gateway request timeout", f"{d['requestTimeoutSeconds']} s"),
        (
            "Drain on shutdown",
            f"engine {d['drainSeconds']['engine']} s, gateway {d['drainSeconds']['gateway']} s",
        ),
        *_scale_to_zero_rows(d),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"warning: {w}" for w in d["warnings"]]
    if r.command:
        lines.append("Engine: " + " ".join(_quote(a) for a in r.command))
    return "\n".join(lines)


def _scale_to_zero_rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    z = d.get("scaleToZero")
    if not z:
        return []
    return [
        ("Scale to zero", f"after {z['idleSeconds']} s idle; cold start ~{z['expectedColdStartSeconds']} s"),
        (
            "Requests held at zero",
            f"up to {z['maxHeldRequests']} ({z['maxHeldPerGatewayPod']} per gateway pod), "
            f"{z['holdSeconds']} s each at most",
        ),
    ]


def _lora_rows(r: Review) -> list[tuple[str, str]]:
    lora, memory = r.resource.spec.lora, r.plan.lora
    if lora is None or memory is None:
        return []
    slots = f"{lora.max_loras} x rank {lora.max_lora_rank}"
    return [
        (
            "LoRA per GPU",
            f"{memory.total_bytes / GIB:.2f} GiB (slots {slots}: {memory.slot_bytes / GIB:.2f} GiB; "
            f"buffers and extra CUDA graphs {(memory.total_bytes - memory.slot_bytes) / GIB:.2f} GiB)",
        ),
        ("LoRA adapters", f"{len(lora.adapters)} (held in host memory: {lora.effective_max_cpu_loras})"),
    ]


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in ' {}"') else arg


def cmd_plan(args: argparse.Namespace) -> int:
    reviews, errors, invalid = _review_all(args.file)
    edits = _edits(args, reviews) if args.from_file else {}
    if args.output == "json":
        plans = [r.plan_dict() | _edit_dict(edits.get(_name(r))) for r in reviews] + invalid
        json.dump(plans[0] if len(plans) == 1 else plans, sys.stdout, indent=2)
        print()
    else:
        print("\n\n".join(_table(r) + _edit_table(edits.get(_name(r))) for r in reviews))
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return EXIT_INVALID if errors else 0


def _name(r: Review) -> tuple[str, str]:
    return r.resource.metadata.namespace, r.resource.metadata.name


def _edits(args: argparse.Namespace, reviews: list[Review]) -> dict[tuple[str, str], Any]:
    """The impact of each valid new spec on the running one of the same name in --from."""
    from .manifests.transition import edit_impact  # the builders are not needed by a plain plan

    running, errors, _ = _review_all(args.from_file)
    if errors:
        raise UsageError(f"--from {args.from_file}: " + "; ".join(errors))
    old = {_name(r): r for r in running}
    return {
        _name(r): edit_impact(old[_name(r)], r, args.free_gpus) for r in reviews if r.ok and _name(r) in old
    }


def _edit_dict(impact: Any) -> dict[str, Any]:
    return {} if impact is None else {"edit": impact.as_dict()}


def _edit_table(impact: Any) -> str:
    return (
        ""
        if impact is None
        else "\nEdit of the running spec:\n" + "\n".join(f"  {line}" for line in impact.lines())
    )


def cmd_render(args: argparse.Namespace) -> int:
    reviews, errors, _ = _review_all(args.file)
    if errors:
        for e in errors:
            print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    from .manifests import build_all  # the builders are not needed by plan and crd

    objects = [obj for r in reviews for obj in build_all(r)]
    yaml.safe_dump_all(objects, sys.stdout, sort_keys=False)
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    yaml.safe_dump(crd(), sys.stdout, sort_keys=False)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .reconcile import engine_scrapers
    from .runtime import run  # kopf is imported only when the operator runs

    try:
        engine_scrapers()  # a bad setting stops the operator here, not at its first reconcile
    except ValueError as error:
        raise UsageError(str(error)) from None

    return run(
        namespaces=args.namespace,
        metrics_port=args.metrics_port,
        log_level=args.log_level,
        election=_election(args),
    )


def cmd_lora_sync(args: argparse.Namespace) -> int:
    from . import lorasync  # requests and the HTTP server are not needed by the other commands

    if args.interval <= 0:
        raise UsageError("--interval must be positive")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    settings = lorasync.Settings(
        desired_file=Path(args.desired_file),
        engine_url=args.engine,
        model_cache=Path(args.model_cache),
        api_key=os.environ.get("VLLM_API_KEY") or None,
        interval=args.interval,
        host=args.host,
        port=args.port,
    )
    return lorasync.run(settings)


def _add_lora_sync(sub: Any) -> None:
    sync = sub.add_parser(
        "lora-sync",
        help="sidecar: keep a vLLM engine's LoRA adapters equal to a desired-adapters file",
        description="Run beside a vLLM engine (started with --enable-lora and "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true): every --interval seconds, load the adapters the "
        "desired file lists and the engine lacks, and unload those it no longer lists, without restarting "
        "the engine. A failing adapter is retried with backoff and does not hold up the others. The "
        "engine's API key is read from $VLLM_API_KEY. Serves /status (JSON, per adapter: loaded, error), "
        "/metrics and /healthz.",
    )
    sync.add_argument(
        "--desired-file",
        default=DESIRED_FILE,
        metavar="PATH",
        help='the desired adapters, {"adapters": [{"name": ..., "path": ...} or {"name": ..., '
        '"huggingFace": {"repo": ..., "revision": ...}}]}, usually mounted from a ConfigMap '
        "(default: %(default)s)",
    )
    sync.add_argument(
        "--engine",
        default=f"http://127.0.0.1:{ENGINE_PORT}",
        metavar="URL",
        help="the engine's base URL (default: %(default)s)",
    )
    sync.add_argument(
        "--model-cache",
        default=os.environ.get("HF_HOME", "/models"),
        metavar="DIR",
        help="root of the model cache, mounted at the same path in the engine: adapter paths are relative "
        "to it and Hugging Face adapters are downloaded into DIR/hub (default: $HF_HOME, else /models)",
    )
    sync.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds between comparisons (default: %(default)g)",
    )
    sync.add_argument(
        "--host", default="0.0.0.0", help="address of /status and /metrics (default: %(default)s)"
    )
    sync.add_argument(
        "--port",
        type=int,
        default=SIDECAR_PORT,
        help="port of /status, /ready, /metrics, /healthz (default: %(default)s)",
    )
    sync.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    sync.set_defaults(func=cmd_lora_sync)


def cmd_activator(args: argparse.Namespace) -> int:
    from . import activator  # aiohttp's server is not needed by the other commands

    if args.hold_seconds <= 0 or args.max_held < 1 or args.keepalive_seconds <= 0 or args.poll_seconds <= 0:
        raise UsageError(
            "--hold-seconds, --keepalive-seconds and --poll-seconds must be positive, --max-held >= 1"
        )
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    settings = activator.Settings(
        router_url=args.router.rstrip("/"),
        hold_seconds=args.hold_seconds,
        max_held=args.max_held,
        retry_after_seconds=args.retry_after,
        keepalive_seconds=args.keepalive_seconds,
        poll_seconds=args.poll_seconds,
        host=args.host,
        port=args.port,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
    )
    return activator.run(settings)


def _add_activator(sub: Any) -> None:
    a = sub.add_parser(
        "activator",
        help="gateway sidecar: hold requests while no engine is ready (autoscaling.minReplicas 0)",
        description="Run beside nginx and vllm-router in a gateway pod whose engines scale to zero. nginx "
        "sends here only the requests the router answered 503 for want of a ready engine; they wait, in "
        "arrival order, until the router's /readiness reports an engine, and are then forwarded to the "
        "router. Streams get 200 at once and SSE comments while they wait. Beyond --max-held requests, or "
        "after --hold-seconds, a JSON 503 with Retry-After (an error event in a stream). Serves /metrics, "
        '/scale (JSON {"held": n}, for KEDA\'s metrics-api scaler) and /healthz on the metrics port.',
    )
    a.add_argument(
        "--router",
        default=f"http://{POD.router_host}:{POD.router_port}",
        metavar="URL",
        help="vllm-router (default: %(default)s)",
    )
    a.add_argument("--hold-seconds", type=float, required=True, help="longest wait of one request")
    a.add_argument("--max-held", type=int, required=True, help="requests held at once in this pod")
    a.add_argument(
        "--retry-after",
        type=int,
        default=HOLD_RETRY_AFTER_SECONDS,
        metavar="SECONDS",
        help="Retry-After of the 503s (default: %(default)s)",
    )
    a.add_argument(
        "--keepalive-seconds",
        type=float,
        default=5.0,
        help="seconds between SSE comments (default: %(default)g)",
    )
    a.add_argument(
        "--poll-seconds",
        type=float,
        default=1.0,
        help="seconds between readiness polls (default: %(default)g)",
    )
    a.add_argument(
        "--host", default="127.0.0.1", help="address nginx sends held requests to (default: %(default)s)"
    )
    a.add_argument("--port", type=int, default=POD.activator_port, help="(default: %(default)s)")
    a.add_argument(
        "--metrics-host", default="0.0.0.0", help="address of /metrics, /scale (default: %(default)s)"
    )
    a.add_argument(
        "--metrics-port", type=int, default=POD.activator_metrics_port, help="(default: %(default)s)"
    )
    a.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    a.set_defaults(func=cmd_activator)


def _election(args: argparse.Namespace) -> Election | None:
    """The Lease to contend for, or None without leader election (by default: outside a cluster, where
    Kubernetes sets no KUBERNETES_SERVICE_HOST, e.g. a developer's `qwen-operator run`)."""
    wanted = (
        args.leader_elect
        if args.leader_elect is not None
        else bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    )
    if not wanted:
        return None
    from .leader import Election

    if not args.leader_elect_resource_namespace:
        raise UsageError(
            "leader election needs the operator's namespace: set POD_NAMESPACE or pass "
            "--leader-elect-resource-namespace (or run with --no-leader-elect)"
        )
    timing = Timing(
        args.leader_elect_lease_duration, args.leader_elect_renew_deadline, args.leader_elect_retry_period
    )
    if timing.problems():
        raise UsageError("; ".join(timing.problems()))
    return Election(args.leader_elect_resource_namespace, args.leader_elect_resource_name, timing=timing)


def _add_leader_election(run: argparse.ArgumentParser) -> None:
    """Leader election flags, named as kube-controller-manager names them."""
    group = run.add_argument_group(
        "leader election",
        "Of several replicas only the holder of a coordination.k8s.io Lease reconciles; the others serve "
        "/healthz and /metrics (qwen_operator_leader 0) and wait to take over. Losing the Lease ends the "
        f"process with status {LOST_EXIT_CODE}.",
    )
    group.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="contend for the leader Lease before reconciling (default: on when running in a cluster, "
        "i.e. KUBERNETES_SERVICE_HOST is set; off otherwise)",
    )
    group.add_argument(
        "--leader-elect-resource-namespace",
        default=os.environ.get("POD_NAMESPACE", ""),
        metavar="NAMESPACE",
        help="namespace of the Lease (default: $POD_NAMESPACE, the operator's own namespace)",
    )
    group.add_argument(
        "--leader-elect-resource-name",
        default=LEASE_NAME,
        metavar="NAME",
        help="name of the Lease (default: %(default)s)",
    )
    group.add_argument(
        "--leader-elect-lease-duration",
        type=float,
        metavar="SECONDS",
        default=LEASE_SECONDS,
        help="seconds a follower waits after the last renewal before taking over (default: %(default)g)",
    )
    group.add_argument(
        "--leader-elect-renew-deadline",
        type=float,
        metavar="SECONDS",
        default=RENEW_DEADLINE_SECONDS,
        help="seconds the leader keeps trying to renew before it gives up (default: %(default)g)",
    )
    group.add_argument(
        "--leader-elect-retry-period",
        type=float,
        metavar="SECONDS",
        default=RETRY_SECONDS,
        help="seconds between attempts to acquire or renew (default: %(default)g)",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qwen-operator", description=__doc__.splitlines()[0] if __doc__ else None
    )
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the capacity plan; exit 1 when invalid or it does not fit")
    plan.add_argument("-f", "--file", required=True, help="QwenDeployment YAML ('-' for stdin)")
    plan.add_argument("-o", "--output", choices=["table", "json"], default="table")
    plan.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="the spec that runs now: also say what the edit to -f does to the engines (replaced or kept, "
        "Surge or InPlace, how many serve at the worst moment)",
    )
    plan.add_argument(
        "--free-gpus",
        type=int,
        metavar="N",
        help="free GPUs in the pool, for --from (default: unknown, so InPlace, as the operator does "
        "when it may not read nodes)",
    )
    plan.set_defaults(func=cmd_plan)
    render = sub.add_parser("render", help="print every object the operator would create, as YAML")
    render.add_argument("-f", "--file", required=True, help="QwenDeployment YAML ('-' for stdin)")
    render.set_defaults(func=cmd_render)
    crd_cmd = sub.add_parser("crd", help="print the QwenDeployment CustomResourceDefinition")
    crd_cmd.set_defaults(func=cmd_crd)
    run = sub.add_parser("run", help="run the operator")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeat)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces (default)")
    run.add_argument("--metrics-port", type=int, default=8080, help="port of /metrics and /healthz")
    run.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="log level of the JSON logs",
    )
    _add_leader_election(run)
    run.set_defaults(func=cmd_run)
    _add_lora_sync(sub)
    _add_activator(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
