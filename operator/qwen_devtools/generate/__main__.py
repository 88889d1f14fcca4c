"""`python -m qwen_devtools.generate`: write every generated file (`make generate`) or check them.

    python -m qwen_devtools.generate               # write into the repository
    python -m qwen_devtools.generate --out-dir D   # write the same tree under D
    python -m qwen_devtools.generate --check       # exit 1 listing the files that are stale

Generated (files.TARGETS): the CRD (crds/, and the chart's template), the chart's RBAC rules for the
managed kinds, values.schema.json and README.md (from values.yaml), its Grafana dashboard JSON,
manifests/install.yaml (rendered from the chart with the pinned helm; QWEN_HELM overrides the binary),
docs/crd-reference.md, the argocd-cm patch that inlines the Argo CD health check, the vLLM flag table,
both images' requirements.txt and images/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from .files import REPO, TARGETS, Target, build, stage_tree, stale, write


def main(argv: list[str] | None = None, *, repo: Path = REPO, targets: tuple[Target, ...] = TARGETS) -> int:
    """`repo` and `targets`: the checkout written or checked and the files made (a test's tmp copy)."""
    parser = argparse.ArgumentParser(
        prog="python -m qwen_devtools.generate", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--out-dir", type=Path, help="write the generated tree here instead")
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated file is stale")
    args = parser.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        stage = stage_tree(Path(tmp))
        built = build(stage, targets)
        if args.check:
            for rel in stale(stage, built.written, repo):
                print(f"stale: {rel}", file=sys.stderr)
                failed = True
            if failed:
                print("run `make generate` and commit the result", file=sys.stderr)
        else:
            target = args.out_dir or repo
            for rel in built.written:
                write(target / rel, (stage / rel).read_text())
                print(f"wrote {target / rel}")
    # CI sets QWEN_REQUIRE_REAL_PARTS: a file it cannot make there is a failure, not a skip
    required = bool(os.environ.get("QWEN_REQUIRE_REAL_PARTS"))
    for rel, why in built.skipped.items():
        print(f"{'error' if required else 'skipped'}: {rel}: {why}", file=sys.stderr)
    if required and built.skipped:
        print("QWEN_REQUIRE_REAL_PARTS is set: a file not made here fails the run", file=sys.stderr)
    return 1 if failed or (required and built.skipped) else 0


if __name__ == "__main__":
    sys.exit(main())
