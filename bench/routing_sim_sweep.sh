#!/bin/bash
# The picker configurations of docs/benchmarks.md "balance window and prefill coalescing" on the
# routing simulator (virtual clock, deterministic): bash bench/routing_sim_sweep.sh > bench/results/routing-sim-docs-coalesce.txt
cd "$(dirname "$0")/.."
base="--workload docs --docs 16 --doc-words 2000 --requests 200 --scale 1 --cache-tokens 12000 --time-scale 0.1 --pending-ttl 1"
echo "# bench/routing_sim.py $base --start SEED --map-delay MD --routers R [ARGS]"
echo "# config seed hit ttft_p50 ttft_p95 ttft_p99 max/mean (virtual ms)"
line() { awk -v tag="$1" '/^(picker|approx_tree) +hit/ {printf "%s %s %s %s %s %s\n", tag, $3, $6, $8, $10, $13}'; }
for md in 0.2 0.0; do
  for cfg in old window window+coalesce; do
    case $cfg in old) a="--balance-window 0 --coalesce-wait 0";; window) a="--coalesce-wait 0";; *) a="";; esac
    for s in $(seq 500 511); do
      .venv/bin/python bench/routing_sim.py $base --start $s --map-delay $md --routers picker $a | line "md$md $cfg $s"
    done
  done
done
for s in $(seq 500 511); do
  .venv/bin/python bench/routing_sim.py $base --start $s --routers approx_tree | line "approx_tree - $s"
done
# held-out seeds (never used to choose a setting): the defaults against the approximate trees
for s in $(seq 520 543); do
  .venv/bin/python bench/routing_sim.py $base --start $s --map-delay 0.2 --routers picker | line "heldout picker $s"
  .venv/bin/python bench/routing_sim.py $base --start $s --routers approx_tree | line "heldout approx_tree $s"
done
