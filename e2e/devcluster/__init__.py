"""Local Kubernetes control plane ("dev cluster") for the operator's end-to-end tests.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from Go modules, with kwok
simulating GPU node pools and the pod lifecycle; everything runs as local processes on 127.0.0.1.
Command line: ``PYTHONPATH=e2e python -m devcluster {build,up,down,status,kubeconfig,env}``;
pytest plugin: ``devcluster.fixtures``.
"""

from .build import HELM_VERSION, K8S_VERSION, KWOK_VERSION, bin_dir, binary

__all__ = ["HELM_VERSION", "K8S_VERSION", "KWOK_VERSION", "bin_dir", "binary"]
