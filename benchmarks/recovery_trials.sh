#!/usr/bin/env bash
# recovery_trials.sh — how long survivors take from a failure to training again, over
# many trials: "a worker dies" (rank 3 of 6), "rank 0 dies" (it served the first store),
# and, with --link (root, benchmarks/netlab), "a link goes down" (rank 2 of 4 in the lab).
#
#   benchmarks/recovery_trials.sh [--trials N] [--transport shm|tcp] [--link] BUILD_DIR
#
# Each trial is one job of tests/multiprocess/recovery_worker; the time is each survivor's
# "training again <t> ms after the failure" (from the moment the dying rank or the lab
# wrote failure_time.* to the survivor's first step finished in the new world), and a
# trial counts the slowest survivor. A job that outlives its deadline is a hang.
set -euo pipefail

trials=20
transport=tcp
link=0
while [[ $# -gt 1 ]]; do
  case "$1" in
    --trials) trials=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --link) link=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
build=${1:?usage: recovery_trials.sh [--trials N] [--transport shm|tcp] [--link] BUILD_DIR}
run="$build/tools/qcoll-run/qcoll-run"
worker="$build/tests/recovery_worker"
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# one_trial <survivors expected> <command…>: prints the slowest survivor's time, or why not.
one_trial() {
  local expected=$1; shift
  rm -f "$scratch"/*
  local out status=0
  out=$(QCOLL_TIMEOUT_MS=${QCOLL_TIMEOUT_MS:-2000} timeout 120 "$@" 2>&1) || status=$?
  if [[ $status -eq 124 ]]; then echo hang; return; fi
  local times
  times=$(grep -o 'training again [0-9]* ms' <<<"$out" | awk '{print $3}' | sort -n)
  if [[ $(wc -l <<<"$times") -ne $expected || -z $times ]]; then echo "failed"; echo "$out" >&2; return; fi
  tail -1 <<<"$times"
}

summarize() {  # name, then one result per line on stdin
  python3 -c '
import sys, statistics
name = sys.argv[1]
results = [l.strip() for l in sys.stdin if l.strip()]
times = sorted(int(r) for r in results if r.isdigit())
hangs = results.count("hang"); failed = results.count("failed")
if times:
    print(f"| {name} | {len(results)} | {times[0]} | {statistics.median(times):.0f} | {times[-1]} | {hangs} | {failed} |")
else:
    print(f"| {name} | {len(results)} | – | – | – | {hangs} | {failed} |")
' "$1"
}

echo "| scenario ($transport) | trials | min ms | median ms | max ms | hangs | failed |"
echo "|---|--:|--:|--:|--:|--:|--:|"
for i in $(seq "$trials"); do
  one_trial 5 "$run" -n 6 --transport "$transport" --keep-going "$worker" residuals 3 "$scratch"
done | summarize "a worker dies (rank 3 of 6)"
for i in $(seq "$trials"); do
  one_trial 5 "$run" -n 6 --transport "$transport" --keep-going "$worker" residuals 0 "$scratch"
done | summarize "rank 0 dies (of 6)"
if [[ $link -eq 1 ]]; then
  for i in $(seq "$trials"); do
    one_trial 3 "$here/netlab" -n 4 --rate 1gbit --keep-going --link-down 2@1.5 --event-dir "$scratch" \
      -- "$worker" cut 2 "$scratch"
  done | summarize "a link goes down (rank 2 of 4, netlab)"
fi
