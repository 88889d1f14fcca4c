"""The images built here with podman, without a registry: the operator and gateway from the project's
own Dockerfiles and the test-only vLLM CPU engine, on a Debian base made with debootstrap, each
archived once per content key for the real node's containerd (`ctr images import`).

    python -m qwen_devtools.images build [operator|gateway|engine-cpu|all]
    python -m qwen_devtools.images status

Modules: ``podman`` (the command line these machines need), ``base`` (the debootstrap base),
``specs`` (what each image is made of and its content key), ``build`` (building and archiving once),
``archive`` (reading an archive's config without podman).
"""

from __future__ import annotations

from .archive import ArchiveImage, read_archive
from .build import BuiltImage, VenvMissing, archive_path, ensure_image, ensure_serving, image_key
from .podman import PodmanMissing, images_dir
from .specs import NAMES, SERVING, SPECS

__all__ = [
    "NAMES",
    "SERVING",
    "SPECS",
    "ArchiveImage",
    "BuiltImage",
    "PodmanMissing",
    "VenvMissing",
    "archive_path",
    "ensure_image",
    "ensure_serving",
    "image_key",
    "images_dir",
    "read_archive",
]
