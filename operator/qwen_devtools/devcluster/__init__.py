"""Local Kubernetes control plane ("dev cluster") for the operator's end-to-end tests and the demo.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from Go modules, with kwok
simulating GPU node pools and the pod lifecycle; everything runs as local processes on 127.0.0.1.
Opt-in, one per machine: a real node (``up --real-node``, realnode.py) where pods really run: kubelet,
containerd, kube-proxy and CoreDNS on a bridge of its own; the apiserver then binds to the bridge's
address so pods reach it, and the simulated CPU node is tainted so that pods without tolerations land
on the real node.
Command line: ``python -m qwen_devtools.devcluster {build,up,down,status,kubeconfig,env}``; the pytest
fixtures (``cluster``, ``api_client``, ``namespace``, and ``real_cluster``, ``real_api_client``,
``real_namespace`` for the real node) are in e2e/conftest.py.
"""
