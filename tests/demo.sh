#!/usr/bin/env bash
# The README's demo: bring the local Slurm cluster up and run the smoke job.
# Later issues turn this into the full recovery demo. Leaves the cluster up
# with REFT_DEMO_KEEP=1; otherwise takes it down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=tests/cluster/cluster

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

$CLUSTER up
eval "$($CLUSTER env)"
[ "${REFT_DEMO_KEEP:-0}" = 1 ] || trap '$CLUSTER down' EXIT

step "the cluster"
sinfo -N -o '%N %t %c'

step "MPI over PMIx on 4 nodes, 8 ranks, as an unprivileged user"
home=$REFT_CLUSTER_DIR/home/reft-alice
runuser -u reft-alice -- env SLURM_CONF="$SLURM_CONF" srun --chdir="$home" -N4 -n8 --mpi=pmix "$PWD/build/reft-mpi-smoke" | sort -n -k2

step "each node has its own memory: a file in n1's /dev/shm"
srun -N1 -w n1 sh -c 'echo state > /dev/shm/demo; echo "n1: $(ls /dev/shm)"'
srun -N1 -w n2 sh -c 'echo "n2: $(ls /dev/shm | wc -l) files"'

step "node loss: kill-node n1 takes its processes and memory; revive brings it back empty"
$CLUSTER kill-node n1
$CLUSTER revive n1
srun -N1 -w n1 sh -c 'echo "n1 after revive: $(ls /dev/shm | wc -l) files"'

step "accounting (sacct)"
sleep 1
sacct -a -X -o JobID,User,JobName%16,NodeList,State | tail -n 5
