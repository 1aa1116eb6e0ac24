#!/usr/bin/env bash
# bench/overload.py on a lent GPU machine's 16 cores: issue 10's benchmark with the gateway on
# cores of its own (on the 2-core box Envoy, the filter server, the rate-limit service, Redis,
# the emulators and the load client share two). Prepared here by
#   bash bench/device/prepare.sh --routing
# then run there with carry [".dev"] and bench/results + docs/img moved out of the working tree
# (the tool carries 64 MiB with it):  bash bench/device/run_overload.sh [overload.py args]
# Without arguments: every level and the arms envoy, sglang-router, tokenweir and
# interactive-alone, storms on envoy and tokenweir (about 7 minutes). Writes $OUT/overload/
# (overload.json, overload.md, plots), overload.log and env.txt.
set -u
OUT="${OUT:-/tmp/tw-device-out}"
mkdir -p "$OUT/overload"
exec > >(tee -a "$OUT/overload.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${TW_SKIP_SITE:+:/tmp/site}"
t0=$(date +%s)
phase() { echo "=== $(($(date +%s) - t0)) s: $*"; }

. "$(dirname "$0")/unpack.sh"
mkdir -p bench/results docs/img  # moved out of the tree that travelled
args=("$@")
[ $# -eq 0 ] && args=(--levels 0.25 1 2 3 --arms envoy sglang-router tokenweir interactive-alone
                      --storm-arms envoy tokenweir)
phase "overload: ${args[*]}"
timeout "${TW_LIMIT:-540}" python3 bench/overload.py "${args[@]}" \
  --out-dir "$OUT/overload" --img-dir "$OUT/overload" || echo "overload.py failed: $?"
uptime
phase "done"
