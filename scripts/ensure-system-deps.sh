#!/usr/bin/env bash
# Installs the system binaries the test-suite needs that PyPI does not ship (redis-server).
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing redis-server (Debian package)" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
  # Debian starts a system redis on 6379; the tests never use it.
  $SUDO systemctl stop redis-server >/dev/null 2>&1 || true
fi
