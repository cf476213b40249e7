#!/bin/sh
# Starts N ranks of a program with only the variables srun gives its tasks, as a
# stand-in for Slurm (not installed here), laid out as `srun -N 2 -n N` with block
# distribution would: both "nodes" are this host under the name localhost, so the ranks
# look for the store on the step's first node by name, over TCP, with no MASTER_ADDR.
#   slurm_style.sh N prog args…      (N even)
set -eu
n=$1
shift
per_node=$((n / 2))
pids=""
rank=0
while [ "$rank" -lt "$n" ]; do
  env -u QCOLL_RANK -u QCOLL_WORLD_SIZE -u QCOLL_STORE -u QCOLL_JOB_ID -u MASTER_ADDR -u MASTER_PORT \
    SLURM_PROCID=$rank SLURM_NTASKS=$n SLURM_NODEID=$((rank / per_node)) SLURM_LOCALID=$((rank % per_node)) \
    SLURM_STEP_TASKS_PER_NODE="$per_node(x2)" SLURM_STEP_NODELIST="localhost,localhost" SLURMD_NODENAME=localhost \
    SLURM_JOB_ID=$$ SLURM_STEP_ID=0 "$@" &
  pids="$pids $!"
  rank=$((rank + 1))
done
status=0
for pid in $pids; do
  wait "$pid" || status=$?
done
exit $status
