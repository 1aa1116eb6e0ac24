#!/usr/bin/env bash
# Builds .dev/ (git-ignored through .git/info/exclude) for bench/device/run.sh on a lent GPU
# machine, which reaches no registry: the Python wheels the rate-limit service needs beyond that
# machine's image (cp312, manylinux), and Debian's redis-server with its libraries and a wrapper
# that finds them. About 23 MB; the device tool carries at most 64 MiB with the working tree.
#   bash bench/device/prepare.sh      (here, after `make venv` and scripts/ensure-system-deps.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >> .git/info/exclude
rm -rf .dev && mkdir -p .dev/whl .dev/redis/lib .dev/redis/bin
PY=.venv/bin/python
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
pkgs=()
for p in grpcio protobuf xds-protos redis hiredis hpack grpcio-health-checking opentelemetry-api \
         prometheus-client typing-extensions; do
  pkgs+=("$p==$(version "$p")")
done
plat=()
for n in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 \
         manylinux_2_31 manylinux_2_34; do plat+=(--platform "${n}_x86_64"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d .dev/whl "${pkgs[@]}"
server="$(readlink -f "$(command -v redis-server)")"
cp "$server" .dev/redis/redis-server.bin
cp "$(readlink -f "$(command -v redis-cli)")" .dev/redis/redis-cli.bin
for lib in $(ldd "$server" | awk '/=>/ {print $3}'); do
  case "$lib" in */libc.so*|*/libm.so*|*/libstdc++*|*/libgcc_s*) ;; *) cp -L "$lib" .dev/redis/lib/ ;; esac
done
for name in redis-server redis-cli; do
  cat > ".dev/redis/bin/$name" <<WRAP
#!/bin/sh
d="\$(cd "\$(dirname "\$0")/.." && pwd)"
LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/$name.bin" "\$@"
WRAP
  chmod +x ".dev/redis/bin/$name"
done
.dev/redis/bin/redis-server --version
du -sh .dev
