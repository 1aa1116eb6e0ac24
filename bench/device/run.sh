#!/usr/bin/env bash
# One call on a lent GPU machine (16 cores, one H200, no registry): the GPU figures behind the
# emulator's llama-3.1-8b-h200 profile, and the rate-limit service's decisions/s on 16 cores.
# Prepared by bench/device/prepare.sh here; run there from the repository root with
#   carry: [".dev"]   command: bash bench/device/run.sh
# Writes $OUT/{env.txt,gpu_profile.json,rls_16core.json,run.log}. Each phase has its own time
# limit, and a failed phase does not stop the next one.
set -u
OUT="${OUT:-/tmp/tw-device-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
t0=$(date +%s)
phase() { echo "=== $(($(date +%s) - t0)) s: $*"; }

phase "machine"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  nproc; free -g | head -2; python3 --version
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"
  grep -m1 "model name" /proc/cpuinfo
  python3 -c "
import time
for _ in range(3):
    t = time.perf_counter()
    for _ in range(10_000_000): pass
    print('10M-iteration loop s', round(time.perf_counter() - t, 3))"
} 2>&1 | tee "$OUT/env.txt"

phase "GPU: Llama-3.1-8B-shaped step times"
timeout 300 python3 bench/gpu_profile.py --out "$OUT/gpu_profile.json" \
  --batches 1 8 32 64 128 192 256 384 512 | grep -v '^[ {}\[\]"]' || echo "gpu phase failed: $?"

phase "install the carried wheels and redis-server"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .dev/whl/*.whl \
  || echo "pip install failed: $?"
export PATH="$PWD/.dev/redis/bin:$PATH"
redis-server --version
check='import ratelimit_service.__main__, grpc, google.protobuf as p; print("imports ok", grpc.__version__, p.__version__)'
if ! python3 -c "$check"; then  # the image's venv refused: a site folder put first by a .pth
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/whl/*.whl
  echo "import sys; sys.path.insert(0, '/tmp/site')" > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/000-tokenweir.pth"
  python3 -c "$check"
fi

phase "rate-limit service on $(nproc) cores"
timeout 360 python3 bench/peers_rls.py --seconds 6 --setups h2:1 h2:2 h2:4:2 h2:8:4 \
  --out "$OUT/rls_16core.json" > "$OUT/rls_stdout.txt" || echo "rls phase failed: $?"
python3 - "$OUT/rls_16core.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["setups"]:
    c, o = s["closed_loop_c200"], s["open_loop_half"]
    print(f"{s['client']} x{s['processes']} loaders {s['loaders']}: closed {c['rps']}/s p99 {c['p99_ms']} ms "
          f"| open {o['rps']}/s p50 {o['p50_ms']} p99 {o['p99_ms']} ms | cpu {c['cpu_seconds']}")
PY
phase "done"
