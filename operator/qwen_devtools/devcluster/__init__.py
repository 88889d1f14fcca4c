"""Local Kubernetes control plane ("dev cluster") for the operator's end-to-end tests and the demo.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from Go modules, with kwok
simulating GPU node pools and the pod lifecycle; everything runs as local processes on 127.0.0.1.
Command line: ``python -m qwen_devtools.devcluster {build,up,down,status,kubeconfig,env}``; the pytest
fixtures (``cluster``, ``api_client``, ``namespace``) are in e2e/conftest.py.
"""
