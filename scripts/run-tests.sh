#!/usr/bin/env bash
# The suite, after the lint (`make test` runs this; `.ci/run` runs `make test`):
#
# 1. at once, side by side:
#    - the parallel phase: every test not marked `serial` or `alone`, on $TEST_WORKERS
#      pytest-xdist workers (one test file per worker);
#    - the serial phase: the tests marked `serial`, one at a time in one more process. They
#      load the box themselves (ramps, storms, drills) and assert shares or timings that hold
#      beside the parallel phase's load; they mostly wait (about 100 CPU-s over 220 s), so run
#      after the rest they added their minutes to the suite's (docs/benchmarks.md, "The test
#      suite's time").
# 2. then the tests marked `alone`, one at a time with nothing beside them: they assert
#    deadlines of tens of milliseconds (Envoy's default timeouts) that a busy 2-core box misses
#    with or without the change under test.
#
# Both phases of step 1 run at the same CPU priority: a `nice` on one would not reach most of
# its CPU, which is spent by the services its tests start in sessions of their own (Linux's
# autogroup scheduling shares the CPU between sessions, whatever their processes' nice).
#
# The parallel phase prints as it runs; the serial phase's report follows it. The exit status is
# non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
WORKERS=${TEST_WORKERS:-4}
# The suite writes bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE=1
# in some images): else each collection rewrites and compiles all ~370 test modules (19 s of CPU
# each instead of 9) and every service process a test starts compiles our packages again (-16%
# CPU over a sample of integration and unit files). __pycache__ is ignored.
PYTEST=(env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/pytest" -q -p no:cacheprovider)

# The files of a phase mark (collecting the whole suite to select a dozen tests costs ~10 CPU-s;
# tests/conftest.py refuses a mark not spelled `pytest.mark.NAME` in its file)
marked() { grep -rlE --include='test_*.py' "pytest\.mark\.$1\b" tests | sort; }
mapfile -t serial_files < <(marked serial)
mapfile -t alone_files < <(marked alone)

log=$(mktemp -t tokenweir-serial.XXXXXX)
base=$(mktemp -d -t tokenweir-serial-tmp.XXXXXX)
trap 'rm -rf "$log" "$base"' EXIT

# Job control: each phase in its own process group, so an interrupt reaches both (a plain
# background job would ignore SIGINT) and each pytest tears its tests down.
set -m
"${PYTEST[@]}" -m "serial and not alone" --basetemp "$base/t" "${serial_files[@]}" > "$log" 2>&1 &
serial=$!
"${PYTEST[@]}" -n "$WORKERS" --dist loadfile --no-loadscope-reorder -m "not serial and not alone" &
parallel=$!
interrupted=0
trap 'interrupted=1; kill -INT -- "-$serial" "-$parallel" 2>/dev/null' INT TERM

finish() {  # the exit status of job $1 once it has ended (a trapped signal interrupts `wait`)
    local rc
    while :; do
        wait "$1"
        rc=$?
        kill -0 "$1" 2>/dev/null || return "$rc"
    done
}
finish "$parallel"
parallel_rc=$?
finish "$serial"
serial_rc=$?
set +m

echo
echo "== the serial phase (the tests marked serial, run beside the parallel phase) =="
cat "$log"
[ "$interrupted" -eq 0 ] || exit 130

echo
echo "== the tests marked alone (nothing beside them) =="
"${PYTEST[@]}" -m alone "${alone_files[@]}"
alone_rc=$?

if [ "$parallel_rc" -ne 0 ] || [ "$serial_rc" -ne 0 ] || [ "$alone_rc" -ne 0 ]; then
    echo "make test: exit status parallel $parallel_rc, serial $serial_rc, alone $alone_rc" >&2
    exit 1
fi
