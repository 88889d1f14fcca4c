"""nginx, Debian's package (tools/system-packages.sh installs it): the binary and its config check."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..require import missing

_SBIN_NGINX = Path("/usr/sbin/nginx")  # not on a non-root user's PATH


def nginx_bin() -> Path:
    """nginx on PATH or in /usr/sbin; skips (or fails) the test without it."""
    found = shutil.which("nginx") or (str(_SBIN_NGINX) if _SBIN_NGINX.exists() else None)
    if not found:
        missing("nginx", "run `make setup` (tools/system-packages.sh installs Debian's nginx)")
    return Path(found)


def nginx_check(conf: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` on conf: the real parser and every directive's checks."""
    return subprocess.run(
        [str(nginx_bin()), "-e", "stderr", "-t", "-c", str(conf)], capture_output=True, text=True
    )
