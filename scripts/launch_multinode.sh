#!/usr/bin/env bash
# Several nodes through DeepSpeed's launcher and a hostfile (one line per node: "host slots=8").
# Every node needs the same repo path and environment; the output_dir should be on shared storage
# so that checkpoints (written by rank 0 after a barrier) are visible to all ranks on resume.
#   bash scripts/launch_multinode.sh hostfile configs/grpo_math.yaml train.output_dir=/shared/runs/x
set -euo pipefail
hostfile=${1:?usage: launch_multinode.sh HOSTFILE CONFIG.yaml [key=value ...]}; shift
cfg=${1:?usage: launch_multinode.sh HOSTFILE CONFIG.yaml [key=value ...]}; shift
exec deepspeed --hostfile "$hostfile" --module mathrl.cli train "$cfg" "$@"
