#!/usr/bin/env bash
# Builds .dev/ (git-ignored through .git/info/exclude) for bench/device/run.sh on a lent GPU
# machine, which reaches no registry: the Python wheels the rate-limit service needs beyond that
# machine's image (cp312, manylinux), and Debian's redis-server with its libraries and a wrapper
# that finds them. About 23 MB; the device tool carries at most 64 MiB with the working tree.
# --routing adds what bench/routing.py needs there (bench/device/run_routing.sh): the whole
# mesh's wheels, Envoy's binary and sglang-router's extension xz-compressed (about 54 MB in all:
# move bench/results and docs/img out of the tree for that call, see run_routing.sh).
# The two builds differ (--routing packs the wheels and Redis): build again for the other script.
#   bash bench/device/prepare.sh [--routing]   (here, after `make venv` and ensure-system-deps.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >> .git/info/exclude
rm -rf .dev && mkdir -p .dev/whl .dev/redis/lib .dev/redis/bin
PY=.venv/bin/python
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
pkgs=()
names=(grpcio protobuf xds-protos redis hiredis hpack grpcio-health-checking opentelemetry-api
       prometheus-client typing-extensions)
routing=0
[ "${1:-}" = "--routing" ] && routing=1
if [ "$routing" = 1 ]; then
  names+=(msgspec pyzmq orjson fastapi starlette pydantic pydantic-core annotated-types
          typing-inspection annotated-doc uvicorn setproctitle sniffio opentelemetry-sdk
          opentelemetry-semantic-conventions)
fi
for p in "${names[@]}"; do
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
  case "$lib" in
    */libc.so*|*/libm.so*|*/libstdc++*|*/libgcc_s*) ;;  # the device's own are as new or newer
    *) cp -L "$lib" .dev/redis/lib/ ;;
  esac
done
for name in redis-server redis-cli; do
  cat > ".dev/redis/bin/$name" <<WRAP
#!/bin/sh
d="\$(cd "\$(dirname "\$0")/.." && pwd)"
LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/$name.bin" "\$@"
WRAP
  chmod +x ".dev/redis/bin/$name"
done
if [ "$routing" = 1 ]; then  # the binaries compress 4-5x with xz; zip (a wheel) only 2-3x
  site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p .dev/bin .dev/sglang_router
  xz -T2 -9 -c "$site/envoy/_bin/envoy" > .dev/bin/envoy.xz
  cp "$site"/sglang_router/*.py .dev/sglang_router/
  xz -T2 -9 -c "$site/sglang_router/sglang_router_rs.abi3.so" > .dev/sglang_router/rs.so.xz
fi
.dev/redis/bin/redis-server --version
if [ "$routing" = 1 ]; then  # every MB counts: the wheels travel installed and xz-packed, Redis too
  rm -rf .dev/site && "$PY" -m pip install -q --no-deps --no-index --no-compile --target .dev/site \
    --python-version 3.12 --implementation cp --only-binary=:all: "${plat[@]}" \
    --platform manylinux_2_26_x86_64 .dev/whl/*.whl
  tar -C .dev/site -cf - . | xz -T2 -9 > .dev/site.tar.xz
  tar -C .dev -cf - redis | xz -T2 -9 > .dev/redis.tar.xz
  rm -rf .dev/site .dev/whl .dev/redis
fi
du -sh .dev
