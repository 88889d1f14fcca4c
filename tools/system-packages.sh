#!/usr/bin/env bash
# Installs the Debian packages the tests use as real parts (nginx for the gateway, promtool for the
# alert rules) when they are missing. Needs root, or passwordless sudo.
set -euo pipefail
missing=()
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
command -v promtool >/dev/null || missing+=(prometheus)
[[ ${#missing[@]} -eq 0 ]] && exit 0
SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
echo "[setup] installing Debian packages: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The packages start their services; the tests start their own instances on loopback.
for svc in nginx prometheus; do $SUDO service "$svc" stop >/dev/null 2>&1 || true; done
