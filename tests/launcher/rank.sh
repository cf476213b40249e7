# One rank of a qcoll-run test job: `sh rank.sh <behaviour> [argument]`, with the job's
# QCOLL_* environment set by qcoll-run. tests/launcher.cmake names the behaviours.
behaviour=$1

case $behaviour in
cpus)  # the CPUs this rank may run on
  echo "cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)"
  ;;
env)  # the job's environment, in one line that check_job.cmake parses
  echo "rank=$QCOLL_RANK size=$QCOLL_WORLD_SIZE local=$QCOLL_LOCAL_RANK" \
       "local_size=$QCOLL_LOCAL_WORLD_SIZE transport=$QCOLL_TRANSPORT store=$QCOLL_STORE" \
       "job=$QCOLL_JOB_ID secret=${QCOLL_SECRET-unset} passthrough=${QCOLL_TEST_PASSTHROUGH-unset}"
  ;;
rank1_fails)  # the others would run for 30 s unless stopped
  if [ "$QCOLL_RANK" = 1 ]; then exit 3; fi
  sleep 30
  ;;
rank1_fails_children_stopped)  # stopping a rank must stop the processes it started too
  if [ "$QCOLL_RANK" = 1 ]; then sleep 1; exit 3; fi
  sleep 30 &
  echo "child $!"
  wait
  ;;
rank1_fails_others_finish)
  if [ "$QCOLL_RANK" = 1 ]; then exit 3; fi
  sleep 1
  echo "rank $QCOLL_RANK finished"
  ;;
rank0_killed)
  if [ "$QCOLL_RANK" = 0 ]; then kill -9 $$; fi
  sleep 30
  ;;
trap)  # exits cleanly on the signal named by the argument
  trap "echo got $2; exit 0" "$2"
  echo ready
  sleep 30 &
  wait
  ;;
ignore_term)  # only SIGKILL stops it (sleep inherits the ignored SIGTERM)
  trap '' TERM
  sleep 30
  ;;
flood)  # awk writes in blocks, so lines reach qcoll-run cut at arbitrary points
  awk -v rank="$QCOLL_RANK" -v lines="$2" 'BEGIN { for (i = 0; i < lines; ++i) print "line " i " of rank " rank }'
  ;;
streams)
  echo "to stdout"
  echo "to stderr" >&2
  printf 'partial stdout'
  printf 'partial stderr' >&2
  ;;
long_line)  # 200000 bytes, no newline
  head -c 200000 /dev/zero | tr '\0' x
  ;;
shm_crash)  # leaves the job's shared memory behind, plus a name that is not the job's
  if [ "$QCOLL_RANK" = 0 ]; then
    : > "/dev/shm/qcoll-$QCOLL_JOB_ID"
    : > "/dev/shm/qcoll-$QCOLL_JOB_ID.extra"
    : > "/dev/shm/qcoll-${QCOLL_JOB_ID}x"
    : > "/dev/shm/qcoll-$QCOLL_JOB_ID-node2"
    : > "/dev/shm/qcoll-$QCOLL_JOB_ID-node2.extra"
    : > "/dev/shm/qcoll-$QCOLL_JOB_ID-nodex"
    kill -9 $$
  fi
  sleep 30
  ;;
*)
  echo "rank.sh: unknown behaviour '$behaviour'" >&2
  exit 99
  ;;
esac
