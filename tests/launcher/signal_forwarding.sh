# sh signal_forwarding.sh <qcoll-run> <rank.sh> <SIGNAL>: a signal sent to qcoll-run alone
# (not to its ranks) reaches every rank, and the job ends cleanly.
# (A non-interactive shell starts background jobs with SIGINT and SIGQUIT ignored, which
# qcoll-run keeps ignored, so only TERM and HUP can be tested this way.)
launcher=$1 rank_script=$2 signal=$3
output=$(mktemp)
trap 'rm -f "$output"' EXIT

"$launcher" -n 3 sh "$rank_script" trap "$signal" > "$output" 2>&1 &
launcher_pid=$!

# Wait until every rank has set its trap.
tries=0
while [ "$(grep -c ready "$output")" -lt 3 ]; do
  tries=$((tries + 1))
  if [ $tries -gt 100 ]; then
    echo "FAIL: the ranks were not ready after 10 s:"
    cat "$output"
    kill -KILL "$launcher_pid"
    exit 1
  fi
  sleep 0.1
done

kill -"$signal" "$launcher_pid"
wait "$launcher_pid"
status=$?
echo "--- qcoll-run's output:"
cat "$output"
echo "---"
failed=0
if [ $status -ne 0 ]; then
  echo "FAIL: qcoll-run exited with status $status, expected 0"
  failed=1
fi
for rank in 0 1 2; do
  if ! grep -qx "\[$rank\] got $signal" "$output"; then
    echo "FAIL: rank $rank did not print 'got $signal'"
    failed=1
  fi
done
grep -q "qcoll-run: forwarding SIG$signal" "$output" || { echo "FAIL: no note of the forwarding"; failed=1; }
[ $failed -eq 0 ] && echo PASS
exit $failed
