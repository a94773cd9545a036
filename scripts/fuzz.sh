#!/usr/bin/env bash
# Long fuzzing runs: loops the fuzz test binary (tests/fuzz.rs) for the
# given number of minutes (default 10) with many cases per run, each run
# under a timeout so a hang is caught. A crash is a non-zero exit or a
# signal; a hang is the timeout firing. Each failing run's whole output
# (proptest's minimal failing input, the seed, the panic) is kept under
# target/fuzz/. Prints one summary line and exits non-zero on any failure.
#
#   scripts/fuzz.sh [minutes] [cases per run]
set -u
cd "$(dirname "$0")/.."

minutes=${1:-10}
cases=${2:-10000}
# A run of $cases cases per target takes a few minutes on two cores; one
# still going after this long counts as a hang.
run_limit=900
logdir=target/fuzz
mkdir -p "$logdir"

cargo test --release --test fuzz --no-run >"$logdir/build.log" 2>&1 || {
    echo "fuzz: build failed, see $logdir/build.log" >&2
    exit 2
}
# The test binary itself, so that the timeout's signal reaches it (not
# only a cargo parent).
bin=$(sed -n 's/.*Executable tests\/fuzz.rs (\(.*\))$/\1/p' "$logdir/build.log" | tail -1)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "fuzz: cannot find the fuzz test binary in $logdir/build.log" >&2
    exit 2
fi

end=$(($(date +%s) + minutes * 60))
runs=0 panics=0 aborts=0 hangs=0
g=0 t=0 h=0
while [ "$(date +%s)" -lt "$end" ]; do
    runs=$((runs + 1))
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
    log="$logdir/run-$runs.log"
    # The last run may end after the deadline: runs are never cut short
    # (a cut run would read as a hang).
    PROPTEST_CASES=$cases PROPTEST_RNG_SEED=$seed \
        timeout -k 10 "$run_limit" "$bin" --nocapture --test-threads=3 >"$log" 2>&1
    rc=$?
    for target in gguf template http; do
        n=$(awk -v t="$target" '$1 == "fuzz-cases" && $2 == t { print $3 }' "$log" | tail -1)
        n=${n:-0}
        case $target in
            gguf) g=$((g + n)) ;; template) t=$((t + n)) ;; http) h=$((h + n)) ;;
        esac
    done
    if [ "$rc" -eq 0 ]; then
        rm -f "$log"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        hangs=$((hangs + 1))
        echo "fuzz: run $runs (PROPTEST_RNG_SEED=$seed) hung past ${run_limit}s; log $log" >&2
    elif [ "$rc" -eq 101 ] && grep -q "panicked" "$log"; then
        panics=$((panics + 1))
        echo "fuzz: run $runs (PROPTEST_RNG_SEED=$seed) failed a case; log $log" >&2
    else
        aborts=$((aborts + 1))
        echo "fuzz: run $runs (PROPTEST_RNG_SEED=$seed) crashed (exit $rc); log $log" >&2
    fi
done
echo "fuzz: gguf $g cases, template $t cases, http $h cases ($runs runs); $panics panics, $aborts aborts, $hangs hangs"
[ $((panics + aborts + hangs)) -eq 0 ]
