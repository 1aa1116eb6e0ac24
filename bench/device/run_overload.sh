#!/usr/bin/env bash
# bench/overload.py on a lent GPU machine's 16 cores: issue 10's benchmark with the gateway on
# cores of its own (on the 2-core box Envoy, the filter server, the rate-limit service, Redis,
# the emulators and the load client share two). Prepared here by
#   bash bench/device/prepare.sh --routing
# then run there with carry [".dev"] and bench/results + docs/img moved out of the working tree
# (the tool carries 64 MiB with it):  bash bench/device/run_overload.sh [overload.py args]
# Without arguments: the unloaded and the 3x level, tokenweir and interactive-alone, no storms.
# The 2026-12-04 run (those two arms, then sglang-router) was cut at 480 s in sglang-router's 3x
# level: tokenweir's 3x level alone took 386 s, its batch clients told to come back minutes later
# (docs/benchmarks.md). Writes $OUT/overload/ (overload.json, overload.md, plots), overload.log
# and env.txt.
set -u
LOG=overload.log

. "$(dirname "$0")/unpack.sh"  # OUT, the log, phase(), the packages
mkdir -p bench/results docs/img "$OUT/overload"  # the first two moved out of the tree that travelled
args=("$@")
[ $# -eq 0 ] && args=(--levels 0.25 3 --arms tokenweir interactive-alone --storm-arms)
phase "overload: ${args[*]}"
timeout "${TW_LIMIT:-540}" python3 bench/overload.py "${args[@]}" \
  --out-dir "$OUT/overload" --img-dir "$OUT/overload" || echo "overload.py failed: $?"
uptime
phase "done"
