#!/usr/bin/env bash
# Runs the whole test suite N times in a row (after `make test` has built it) and prints which
# tests failed in which run. BUSY=1 keeps both cores busy with two spinning processes meanwhile,
# so that tests which only pass on a quiet machine show up.
#   scripts/suite-loop.sh 20            # 20 runs
#   BUSY=1 scripts/suite-loop.sh 10     # 10 runs with both cores busy
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
log_dir=${LOG_DIR:-.build/suite-loop}
mkdir -p "$log_dir"
burners=()
if [ "${BUSY:-0}" = 1 ]; then
  for _ in 1 2; do (while :; do :; done) & burners+=($!); done
fi
trap '[ ${#burners[@]} -gt 0 ] && kill "${burners[@]}" 2>/dev/null' EXIT
failed_runs=0
for run in $(seq 1 "$runs"); do
  out="$log_dir/run-$run.log"
  start=$(date +%s)
  timeout 1200 swift test --skip-build --no-parallel >"$out" 2>&1
  status=$?
  summary=$(grep -E "^. Test run with" "$out" | tail -1)
  if [ $status -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    echo "run $run: FAILED (exit $status, $(( $(date +%s) - start )) s): $summary"
    grep -E "^✘ Test [^ ]+\(.*\) (recorded an issue|failed)" "$out" | sed 's/^/    /' | sort -u | head -20
  else
    echo "run $run: passed ($(( $(date +%s) - start )) s): $summary"
  fi
done
echo "$failed_runs of $runs runs failed${BUSY:+ (BUSY=$BUSY)}"
[ $failed_runs -eq 0 ]
