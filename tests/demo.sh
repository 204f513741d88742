#!/usr/bin/env bash
# The README's demo (`make demo`): on the local Slurm cluster (4 nodes and a
# spare), a batch job trains the Go reference trainer under
# `reft run --spares=1` with --reft=arc; a node is killed in the middle;
# reft run relaunches on the spare, which restores its rank's state from the
# other nodes' memory, and the job finishes with the bits of an
# uninterrupted run. Exits non-zero if the job fails or the hashes differ.
#
# It brings the cluster up when it is down and takes it down at the end only
# then (REFT_DEMO_KEEP=1 leaves it up). It needs the cluster to itself: run
# it when no e2e run is using the cluster (either lane's: they share ports).
# On the trixie lane (REFT_LANE=trixie make demo) it runs inside the lane's
# root, where build/ is build/trixie.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CLUSTER=tests/cluster/cluster
USER_=reft-alice
STEPS=${REFT_DEMO_STEPS:-150}
KILL_AFTER=${REFT_DEMO_KILL_AFTER:-40} # kill the node once this step is logged
FLAGS="--size 256KiB --steps $STEPS --batch 32 --micro 8 --seed 7 --save-every 1 --log-every 10"

bold() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
ts() { date +%H:%M:%S.%3N; }
die() { printf '\033[31mdemo: %s\033[0m\n' "$*" >&2; exit 1; }
as_user() { runuser -u "$USER_" -- env SLURM_CONF="$SLURM_CONF" PATH="$PATH" HOME="$home" USER="$USER_" "$@"; }

[ "$(id -u)" = 0 ] || die "run it as root (it starts the test cluster and acts as its users)"
for b in reft reft-agent reft-train spank_reft.so libreft_spank.so; do
	[ -e "build/$b" ] || die "build/$b is missing: run 'make' first"
done

started=0
if ! $CLUSTER status >/dev/null 2>&1; then
	bold "bringing the local Slurm cluster up (5 nodes: 4 for training, 1 spare)"
	$CLUSTER up --no-reft # the demo installs reft with a configuration of its own
	started=1
fi
eval "$($CLUSTER env)"
home=$REFT_CLUSTER_DIR/home/$USER_
ETC=$REFT_CLUSTER_DIR/etc
CONF=$ETC/reft-demo.toml
LOGDIR=$REFT_CLUSTER_DIR/log/reft
PLUG=$ETC/plugstack.conf.d/reft.conf
mkdir -p "$LOGDIR" && chmod 1777 "$LOGDIR"
saved_plug=$(mktemp)
had_plug=0
if [ -e "$PLUG" ]; then cp "$PLUG" "$saved_plug"; had_plug=1; fi
tailpid=
job=
cleanup() {
	[ -z "$tailpid" ] || kill "$tailpid" 2>/dev/null || true
	[ -z "$job" ] || scancel "$job" 2>/dev/null || true
	if [ "$had_plug" = 1 ]; then cp "$saved_plug" "$PLUG"; else rm -f "$PLUG"; fi
	rm -f "$saved_plug"
	# A killed node stays dead until revived: leave the cluster whole.
	for n in $($CLUSTER status 2>/dev/null | awk '$1 ~ /^slurmd-/ && $2 == "down" {sub("slurmd-", "", $1); print $1}'); do
		$CLUSTER revive "$n" >/dev/null || true
	done
	if [ "$started" = 1 ] && [ "${REFT_DEMO_KEEP:-0}" != 1 ]; then $CLUSTER down; fi
}
trap cleanup EXIT

# The plugin, with a configuration of the demo's own (every node reads it).
cat >"$CONF" <<EOF
[store]
tmpfs_root = "/dev/shm/reft"
[agent]
binary = "$REPO/build/reft-agent"
run_dir = "/dev/shm/reft-run"
start_timeout = "20s"
slurm_conf = "$SLURM_CONF"
[run]
backoff = "500ms"
[log]
dir = "$LOGDIR"
EOF
echo "optional $REPO/build/spank_reft.so config=$CONF" >"$PLUG"

bold "the cluster"
sinfo -N -o '%N %t %c'

bold "uninterrupted run without reft (4 ranks on 4 nodes): the bits to match"
ref=$(as_user srun --chdir="$home" --mpi=pmix -N4 -n4 "$REPO/build/reft-train" $FLAGS)
ref_hash=$(sed -n 's/^final-params-sha256: //p' <<<"$ref")
[ -n "$ref_hash" ] || die "the uninterrupted run printed no hash:"$'\n'"$ref"
echo "final-params-sha256: $ref_hash"

bold "a batch job: 5 nodes, --reft=arc with 1 spare; reft run trains on 4 of them"
script=$home/reft-demo.sbatch
cat >"$script" <<EOF
#!/bin/bash
#SBATCH -N5 --no-kill --requeue --reft=arc,spares=1
#SBATCH --output=$home/reft-demo-%j.out
$REPO/build/reft run --config $CONF -- $REPO/build/reft-train $FLAGS --dp 4
rc=\$?
srun --reft=off -N "\$(squeue -h -j \$SLURM_JOB_ID -o %D)" --ntasks-per-node=1 rm -rf /dev/shm/reft/\$(id -u)/\$SLURM_JOB_ID
exit \$rc
EOF
chown "$USER_" "$script"
cat "$script"
job=$(as_user sbatch --parsable --chdir="$home" "$script" | cut -d';' -f1)
out=$home/reft-demo-$job.out
echo "submitted job $job"

# Stream the job's output with timestamps, so the recovery shows as it
# happens.
for _ in $(seq 600); do [ -e "$out" ] && break; sleep 0.1; done
tail -n +1 -F "$out" 2>/dev/null > >(while IFS= read -r l; do printf '  %s | %s\n' "$(ts)" "$l"; done) &
tailpid=$!

for _ in $(seq 1200); do grep -q "^step $KILL_AFTER loss" "$out" 2>/dev/null && break; sleep 0.1; done
grep -q "^step $KILL_AFTER loss" "$out" || die "job $job did not reach step $KILL_AFTER"

bold "reft status $job, before the kill (as $USER_, from outside the job)"
as_user "$REPO/build/reft" status --config "$CONF" "$job" || true

bold "$(ts) kill-node n2: its processes and its memory are gone"
$CLUSTER kill-node n2

# Wait for the job to end (its allocation shrinks when n2 is lost, so
# scontrol's view is the one to follow while slurmctld knows the job).
for _ in $(seq 3000); do
	st=$(scontrol -o show job "$job" 2>/dev/null | sed -n 's/.* JobState=\([A-Z_]*\).*/\1/p' || true)
	case "$st" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) break ;; esac
	sleep 0.1
done
sleep 1
kill "$tailpid" 2>/dev/null || true
wait "$tailpid" 2>/dev/null || true
tailpid=
sleep 0.2 # the timestamping reader drains what tail passed it
echo "job $job: $st"
finished=$job
job=

bold "reft log $finished"
as_user "$REPO/build/reft" log --config "$CONF" "$finished" || true

full=JobID,State,Restarts,Comment%100
bold "sacct -j $finished -o $full"
# Slurm 22.05's sacct has no Restarts field: then scontrol's, beside.
# 24.11's also lists the allocation before n2 was lost, as a RESIZING row.
fields=$full
sacct -j "$finished" -X -o JobID >/dev/null 2>&1 && ! sacct -j "$finished" -X -o "$fields" >/dev/null 2>&1 && fields=JobID,State,Comment%100
for _ in $(seq 50); do
	acct=$(sacct -j "$finished" -X -o "$fields" 2>&1 || true)
	grep -q "reft:" <<<"$acct" && break
	sleep 0.2
done
echo "$acct"
if [ "$fields" != "$full" ]; then
	restarts=$(scontrol -o show job "$finished" 2>/dev/null | sed -n 's/.* Restarts=\([0-9]*\).*/\1/p' || true)
	echo "Restarts=${restarts:-?} (from scontrol: this sacct has no Restarts field)"
fi

bold "identical-hash check against the uninterrupted run"
got=$(sed -n 's/^final-params-sha256: //p' "$out")
echo "uninterrupted: $ref_hash"
echo "with the kill: ${got:-<none>}"
[ "$st" = COMPLETED ] || die "job $finished ended $st"
[ "$got" = "$ref_hash" ] || die "the hashes differ"
printf '\033[32mdemo: identical parameters after losing n2 mid-training\033[0m\n'
