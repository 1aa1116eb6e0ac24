#!/usr/bin/env bash
# Installs the system binaries the test-suite needs that PyPI does not ship (Debian packages).
# One line per binary below: "command-to-look-for debian-package". Only missing ones are installed.
set -euo pipefail
NEEDED=(
  "redis-server redis-server"
  "chromium chromium"  # the dashboard's browser test (Playwright drives the system browser)
  "prometheus prometheus"
  "promtool prometheus"
)
missing=()
for entry in "${NEEDED[@]}"; do
  read -r cmd pkg <<<"$entry"
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts system services (redis on 6379, ...); the tests never use them.
for svc in redis-server prometheus; do
  $SUDO systemctl stop "$svc" >/dev/null 2>&1 || true
done
