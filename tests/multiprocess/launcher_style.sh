#!/bin/sh
# Starts N ranks of a program with only the variables a launcher that is not installed
# here gives its processes, as a stand-in for it:
#   launcher_style.sh torchrun N PORT prog args…
#     RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
#     TORCHELASTIC_RUN_ID, as torchrun gives its workers (one host).
#   launcher_style.sh slurm N prog args…      (N even)
#     what `srun -N 2 -n N` with block distribution gives its tasks (SLURM_PROCID,
#     SLURM_NTASKS, SLURM_NODEID, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE,
#     SLURM_STEP_NODELIST, SLURMD_NODENAME, SLURM_JOB_ID, SLURM_STEP_ID): both "nodes"
#     are this host under the name localhost, so the ranks find the store on the
#     step's first node by name, over TCP, with no MASTER_ADDR.
set -eu
launcher=$1 n=$2
shift 2
case $launcher in
  torchrun) port=$1; shift ;;
  slurm) per_node=$((n / 2)) ;;
  *) echo "launcher_style.sh: torchrun or slurm, not '$launcher'" >&2; exit 2 ;;
esac
pids=""
rank=0
while [ "$rank" -lt "$n" ]; do
  if [ "$launcher" = torchrun ]; then
    set -- RANK=$rank WORLD_SIZE=$n LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      TORCHELASTIC_RUN_ID="torchrun-style-$$" "$@"
  else
    set -- SLURM_PROCID=$rank SLURM_NTASKS=$n SLURM_NODEID=$((rank / per_node)) SLURM_LOCALID=$((rank % per_node)) \
      SLURM_STEP_TASKS_PER_NODE="$per_node(x2)" SLURM_STEP_NODELIST="localhost,localhost" \
      SLURMD_NODENAME=localhost SLURM_JOB_ID=$$ SLURM_STEP_ID=0 "$@"
  fi
  env -u QCOLL_RANK -u QCOLL_WORLD_SIZE -u QCOLL_STORE -u QCOLL_JOB_ID -u MASTER_ADDR -u MASTER_PORT "$@" &
  pids="$pids $!"
  # Drop this rank's variables again (7 for torchrun, 9 for Slurm).
  if [ "$launcher" = torchrun ]; then shift 7; else shift 9; fi
  rank=$((rank + 1))
done
status=0
for pid in $pids; do
  wait "$pid" || status=$?
done
exit $status
