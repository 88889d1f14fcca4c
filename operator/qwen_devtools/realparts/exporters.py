"""The gateway's two exporters, built from their pinned Go modules into the cache (about 10 s each).

``python -m qwen_devtools.realparts.exporters`` builds both (what `make setup` runs) and prints their
paths.
"""

from __future__ import annotations

from pathlib import Path

from qwen_operator.versions import (
    NGINX_EXPORTER,
    NGINX_EXPORTER_MODULE,
    NGINXLOG_EXPORTER,
    NGINXLOG_EXPORTER_MODULE,
)

from ..gotools import GoMissing, go_program
from ..require import missing


def _exporter(module: str, version: str, directory: str, binary: str) -> Path:
    try:
        return go_program(module, version, directory, binary)
    except GoMissing as error:
        missing(str(error), "install Go 1.22 or newer")


def nginxlog_exporter_bin() -> Path:
    """prometheus-nginxlog-exporter (per-key metrics from nginx's access log)."""
    return _exporter(
        NGINXLOG_EXPORTER_MODULE, NGINXLOG_EXPORTER, "nginxlog-exporter", "prometheus-nginxlog-exporter"
    )


def nginx_exporter_bin() -> Path:
    """nginx-prometheus-exporter (stub_status metrics)."""
    return _exporter(
        NGINX_EXPORTER_MODULE, NGINX_EXPORTER, "nginx-prometheus-exporter", "nginx-prometheus-exporter"
    )


if __name__ == "__main__":
    print(nginxlog_exporter_bin())
    print(nginx_exporter_bin())
