"""Dev and test tooling of the qwen-operator repository: the local dev cluster, the real processes the
tests run (vLLM CPU engines, vllm-router, nginx, exporters), the operator as a local process, the demo.

Never imported by the product: `qwen_operator` must not import `qwen_devtools` (an import-linter
contract checks it), and the operator image ships only `qwen_operator`. Everything here expects to run
from a checkout of the repository (an editable install), next to tools/, charts/ and manifests/.
"""
