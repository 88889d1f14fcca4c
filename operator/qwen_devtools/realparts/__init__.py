"""Real processes for tests and benchmarks: the vLLM CPU engine, vllm-router, nginx and the two exporters.

Everything binds to 127.0.0.1 on ports chosen at run time, runs in its own session (process group)
and is always stopped by signalling that group (qwen_devtools.procs). Output goes to a log file whose
tail is shown when a process fails to become ready.

The API, in short:
  engine.start_engine(model, ...)    context manager: a ready vLLM engine (Proc: .url, .port, .log, .stop())
  engine.spawn_engine + procs.wait_ready   the same in two steps, to start several engines side by side
  engine.test_engine_args(command)   the operator's rendered engine flags minus the machine-specific ones
  gateway.start_gateway(review, urls, api_keys, engine_key)
                                     the gateway exactly as rendered (nginx via run-nginx.sh, vllm-router,
                                     exporters) in front of running engines (GatewayStack: .url,
                                     .set_api_keys())
  paced_sse.start_paced_sse_source() a fake engine streaming events at a fixed pace
  nginx.nginx_bin(), exporters.nginxlog_exporter_bin(), ..., qwen_devtools.vllm_env.vllm_python(),
  vllm_router_bin()                  paths of the real parts
The tiny random Qwen3 model they serve is qwen_devtools.model (the `tiny_model` fixture of tests/).

Use in a test module::

    from qwen_devtools.realparts.engine import start_engine

    def test_something(tiny_model):
        with start_engine(tiny_model, extra_args=["--reasoning-parser", "qwen3"]) as engine:
            requests.post(f"{engine.url}/v1/completions", json={...})

Missing parts (the cached vLLM venv, nginx, Go for the exporters) skip the test with the command that
installs them, unless QWEN_REQUIRE_REAL_PARTS is set (CI sets it): then they fail it.
"""
