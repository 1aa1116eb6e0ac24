#!/usr/bin/env bash
# bench/routing.py on a lent GPU machine's 16 cores: is the picker's TTFT gap to sglang-router
# (1.4-2x on the 2-core development box) the box's CPU, or the route? Prepared here by
#   bash bench/device/prepare.sh --routing
# then run there with carry [".dev"] and bench/results + docs/img moved out of the working tree
# (the tool carries 64 MiB with it):  bash bench/device/run_routing.sh
# Two runs of each workload (trace, shared documents), the arms picker, sglang-router and ring
# hash in that order, with the 2-core box's settings. Writes $OUT/routing-*.json, routing.log, env.txt.
set -u
LOG=routing.log

# With arguments: one bench/routing.py run with them (TW_UNPACKED=1 skips the unpacking that an
# earlier call on the same machine did); without: the default set below.
. "$(dirname "$0")/unpack.sh"  # OUT, the log, phase(), the packages
mkdir -p bench/results docs/img  # moved out of the tree that travelled: routing.py writes there
# every request's TTFT split (bench/routing_split.py), all runs so far, as ONE file: the tool
# brings back only so many files
pack_rows() { tar -czf "$OUT/rows.tar.gz" -C /tmp $(cd /tmp && ls tw-routing-*/rows-*.json 2>/dev/null); }
if [ $# -gt 0 ]; then
  phase "routing: $*"
  timeout 240 python3 bench/routing.py "$@" --run-dir /tmp 2>&1 | grep -E "ceiling|arm |  hit|split|rror"
  cp bench/results/routing-*.json "$OUT"/ 2>/dev/null
  pack_rows
  phase "done"
  exit 0
fi

runs="1 2"; n_trace=300; n_docs=200; tag="${TW_TAG:-16core}"  # results routing-*-TAG-RUN.json
[ -n "${TW_QUICK:-}" ] && { runs=1; n_trace=40; n_docs=30; }  # a rehearsal of the script
for run in $runs; do
  for workload in trace docs; do
    phase "routing: $workload, run $run"
    if [ "$workload" = trace ]; then extra=(--start 500 --requests "$n_trace" --scale 4)
    else extra=(--docs 16 --doc-words 2000 --requests "$n_docs" --scale 1 --cache-tokens 12000); fi
    timeout 240 python3 bench/routing.py --workload "$workload" "${extra[@]}" \
      --arms picker sglang-router ring_hash --tag "$tag-$run" --run-dir /tmp 2>&1 \
      | grep -E "ceiling|arm |  hit|split|Error|error" || echo "routing $workload failed"
    cp bench/results/routing-"$workload"-"$tag"-"$run".json "$OUT"/ 2>/dev/null
  done
done
pack_rows
phase "done"
