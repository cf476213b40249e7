#!/bin/sh
# Starts N ranks of a program with only the variables torchrun gives its workers
# (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
# TORCHELASTIC_RUN_ID), as a stand-in for torchrun where PyTorch is not installed.
#   torchrun_style.sh N PORT prog args…
set -eu
n=$1 port=$2
shift 2
pids=""
rank=0
while [ "$rank" -lt "$n" ]; do
  env -u QCOLL_RANK -u QCOLL_WORLD_SIZE -u QCOLL_STORE -u QCOLL_JOB_ID \
    RANK=$rank WORLD_SIZE=$n LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    TORCHELASTIC_RUN_ID="torchrun-style-$$" "$@" &
  pids="$pids $!"
  rank=$((rank + 1))
done
status=0
for pid in $pids; do
  wait "$pid" || status=$?
done
exit $status
