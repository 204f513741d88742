#!/bin/bash
# reft.torch on a GPU machine (tests/gpu/gpu_check.py says what it prints).
# Needs: the conformance agent built here (go build -o bin/conformance-agent
# ./tests/conformance-agent), the machine's python3 with PyTorch + CUDA, no
# Slurm. Run from a tree holding client/python, tests/gpu and the agent:
#
#   bash tests/gpu/run.sh            # on the GPU machine
#   bash tests/gpu/run.sh --cpu      # the dry run, CPU tensors, toy sizes
#   bash tests/gpu/run.sh --undo     # tests/gpu/undo_check.py instead (update-undo
#                                    # on CUDA, every=0's cost); --undo --cpu too
#
# REFT_GPU_AGENT overrides the agent binary; PYTHON the interpreter. (Not
# REFT_CONFORMANCE_AGENT: the conformance agent reads that as its layout.)
# Through the device tool (which ships the lead's checkout plus carried
# ignored paths), stage a self-contained tree first, e.g.:
#   mkdir -p .gpuwork/bin .gpuwork/client/python .gpuwork/tests
#   CGO_ENABLED=0 go build -o .gpuwork/bin/conformance-agent ./tests/conformance-agent
#   cp -r client/python/reft .gpuwork/client/python/; cp -r tests/gpu .gpuwork/tests/
# and run with carry [".gpuwork"]: cd .gpuwork && bash tests/gpu/run.sh
# The script needs about two minutes on an H200 (docs/BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENT=${REFT_GPU_AGENT:-bin/conformance-agent}
[ -x "$AGENT" ] || { echo "no agent at $AGENT: go build -o $AGENT ./tests/conformance-agent" >&2; exit 2; }
PY=${PYTHON:-python3}
SCRIPT=tests/gpu/gpu_check.py
if [ "${1:-}" = --undo ]; then
  SCRIPT=tests/gpu/undo_check.py
  shift
fi
# Arenas live in /dev/shm when it can hold a few snapshots of the GPT
# (containers often give it 64 MiB); else in /tmp (page cache, same path).
STORE=""
avail=$(df -B1 --output=avail /dev/shm 2>/dev/null | tail -1 || echo 0)
if [ "${avail:-0}" -lt $((24 << 30)) ]; then
  STORE=/tmp
  echo "note: /dev/shm has $((avail >> 20)) MiB free; the agent's store goes to /tmp"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader || true
PYTHONPATH=client/python${PYTHONPATH:+:$PYTHONPATH} exec timeout 330 "$PY" "$SCRIPT" --agent "$AGENT" ${STORE:+--store-dir $STORE} "$@"
