# sh first_failure.sh <trials> <expected status> <qcoll-run> <qcoll-run arguments...>: runs the
# same failing job <trials> times; every run must exit with <expected status>, the status of the
# rank that failed first, however close together the other ranks fail after it.
trials=$1 expected=$2
shift 2
output=$(mktemp)
trap 'rm -f "$output"' EXIT

counts="" wrong=0 trial=0
while [ $trial -lt "$trials" ]; do
  trial=$((trial + 1))
  "$@" > "$output" 2>&1
  status=$?
  counts="$counts $status"
  if [ $status -ne "$expected" ]; then
    wrong=$((wrong + 1))
    echo "--- trial $trial exited with status $status, expected $expected; qcoll-run's output:"
    cat "$output"
  fi
done
echo "statuses of $trials trials:" $(echo $counts | tr ' ' '\n' | sort -n | uniq -c | awk '{ print $1 "x" $2 }')
if [ $wrong -ne 0 ]; then
  echo "FAIL: $wrong of $trials trials exited with another status than $expected"
  exit 1
fi
echo PASS
