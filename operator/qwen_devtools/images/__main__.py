"""`python -m qwen_devtools.images`: build the images (once per content key) or show where they stand.

python -m qwen_devtools.images build [operator|gateway|engine-cpu|all ...]   # default: all
python -m qwen_devtools.images status                                       # key, archive, size
python -m qwen_devtools.images prune                                        # drop podman's store
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time

from . import NAMES, SPECS, archive_path, ensure_image, image_key
from .podman import podman, progress, store_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen_devtools.images", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build and archive images whose content changed")
    # no `choices`: argparse (3.11) checks an empty `*` list against them and refuses it
    build.add_argument("names", nargs="*", metavar="NAME", help=f"{', '.join(NAMES)} or all (the default)")
    sub.add_parser("status", help="each image's reference, content key and archive")
    sub.add_parser("prune", help="remove podman's store (archives and the base tarball stay)")
    args = parser.parse_args(argv)
    if args.command == "status":
        for name in NAMES:
            key = image_key(name)
            archive = archive_path(name, key)
            size = f"{archive.stat().st_size / 2**30:.2f} GiB" if archive.exists() else "not built"
            print(f"{name:11} {SPECS[name].ref:50} {key}  {archive} ({size})")
        return 0
    if args.command == "prune":
        # the dev tooling's own store (podman.py): resetting it loses working copies, never an archive
        podman("system", "reset", "--force", check=False, capture=True)
        shutil.rmtree(store_dir(), ignore_errors=True)
        print(f"removed {store_dir()}")
        return 0
    unknown = set(args.names) - {*NAMES, "all"}
    if unknown:
        parser.error(f"unknown image {', '.join(sorted(unknown))} (choose from {', '.join(NAMES)}, all)")
    names = list(NAMES) if not args.names or "all" in args.names else list(dict.fromkeys(args.names))
    started = time.monotonic()
    try:
        for name in names:
            built = ensure_image(name)
            print(f"{name}: {built.ref} {built.archive}")
    except RuntimeError as error:  # PodmanMissing, VenvMissing, debootstrap's failure
        print(f"[images] {error}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as error:
        failed = f"{error.cmd[0]} failed with exit status {error.returncode}"
        print(f"[images] {failed} (output above)", file=sys.stderr)
        return 1
    progress("images", f"{', '.join(names)} ready", started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
