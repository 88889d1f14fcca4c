"""The QwenDeployment API: typed spec, model and GPU catalogs, capacity plan, vLLM command line.

Everything in this package is pure: no I/O, no Kubernetes client.
"""
