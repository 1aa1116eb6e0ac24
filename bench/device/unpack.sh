# Sourced by run_routing.sh and run_overload.sh on a lent machine, with LOG set to the log's
# name: sends this shell's output to $OUT/$LOG too, sets PYTHONPATH and phase(), then unpacks what
# `bash bench/device/prepare.sh --routing` packed into .dev/ (Python packages, Redis, Envoy,
# sglang-router), puts them on PATH and writes $OUT/env.txt. TW_UNPACKED=1 skips the unpacking an
# earlier call on the same machine did; TW_SKIP_SITE=1 (a local rehearsal, with the venv's bin
# first on PATH) keeps the venv's packages and scripts.
OUT="${OUT:-/tmp/tw-device-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$LOG") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${TW_SKIP_SITE:+:/tmp/site}"
t0=$(date +%s)
phase() { echo "=== $(($(date +%s) - t0)) s: $*"; }

if [ -z "${TW_UNPACKED:-}" ]; then
phase "unpack: Python packages, Redis, Envoy, sglang-router"
py="$(python3 -c 'import sys; print(sys.executable)')"
bin="$(dirname "$py")"
mkdir -p /tmp/site /tmp/tw && tar -xJf .dev/redis.tar.xz -C /tmp/tw
if [ -z "${TW_SKIP_SITE:-}" ]; then  # (a local rehearsal installs the same packages itself)
  tar -xJf .dev/site.tar.xz -C /tmp/site
  echo "import sys; sys.path.insert(0, '/tmp/site')" \
    > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/000-tokenweir.pth"
fi
mkdir -p /tmp/site/sglang_router && cp .dev/sglang_router/*.py /tmp/site/sglang_router/
xz -dc .dev/sglang_router/rs.so.xz > /tmp/site/sglang_router/sglang_router_rs.abi3.so
if [ -z "${TW_SKIP_SITE:-}" ]; then  # (a rehearsal's venv has them: never overwrite its scripts)
  xz -dc .dev/bin/envoy.xz > "$bin/envoy" && chmod +x "$bin/envoy"
  for name in tokenweir:tokenweir.cli tokenweir-emulator:backends.emulator.__main__; do
    printf '#!%s\nimport sys\nsys.path.insert(0, "%s")\nfrom %s import main\nsys.exit(main())\n' \
      "$py" "$PWD" "${name#*:}" > "$bin/${name%%:*}" && chmod +x "$bin/${name%%:*}"
  done
fi
export PATH="/tmp/tw/redis/bin:$bin:$PATH"
{ nproc; grep -m1 "model name" /proc/cpuinfo; python3 --version; "$bin/envoy" --version | head -1
  redis-server --version
  python3 -c "import grpc, google.protobuf as p, zmq, msgspec, sglang_router.launch_router, filters, tokenweir.cli; print('imports ok', grpc.__version__, p.__version__)"
  python3 -c "
import time
t = time.perf_counter()
for _ in range(10_000_000): pass
print('10M-iteration loop s', round(time.perf_counter() - t, 3))"
} 2>&1 | tee "$OUT/env.txt"
fi
export PATH="/tmp/tw/redis/bin:$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$PATH"
