"""Kubernetes operator that plans, deploys and runs Qwen3-32B serving clusters on vLLM."""

__version__ = "0.1.0.dev0"
