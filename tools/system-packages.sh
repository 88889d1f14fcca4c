#!/usr/bin/env bash
# Installs the Debian packages the tests use as real parts when they are missing: nginx (and its njs
# module) for the gateway, promtool for the alert rules, and what the dev cluster's real node runs on
# (runc, the CNI plugins, nftables and iptables, conntrack, socat) or is built with (podman for the
# images, debootstrap for their local base).
# Idempotent and quiet when everything is there. Needs root, or passwordless sudo.
set -euo pipefail
missing=()
# need PACKAGE FILE: the package is missing when FILE is not there (sbin paths: a user's PATH may lack them)
need() { [[ -e $2 ]] || missing+=("$1"); }
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
need libnginx-mod-http-js /usr/lib/nginx/modules/ngx_http_js_module.so  # njs: errors.js, spec.gateway.modelAccess
command -v promtool >/dev/null || missing+=(prometheus)
need runc /usr/sbin/runc
need containernetworking-plugins /usr/lib/cni/bridge
need nftables /usr/sbin/nft
need iptables /usr/sbin/iptables
need conntrack /usr/sbin/conntrack
need socat /usr/bin/socat
need podman /usr/bin/podman
need debootstrap /usr/sbin/debootstrap
# podman's own helpers on a minimal install (recommended, not required, by Debian's podman)
need uidmap /usr/bin/newuidmap
need fuse-overlayfs /usr/bin/fuse-overlayfs
need netavark /usr/lib/podman/netavark
[[ ${#missing[@]} -eq 0 ]] && exit 0
SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
echo "[setup] installing Debian packages: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The packages start their services; the tests start their own instances on loopback.
for svc in nginx prometheus; do $SUDO service "$svc" stop >/dev/null 2>&1 || true; done
