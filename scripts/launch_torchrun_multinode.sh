#!/usr/bin/env bash
# Several nodes with torchrun (no ssh from node to node): run this same command on every node.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 bash scripts/launch_torchrun_multinode.sh configs/grpo_math.yaml \
#       train.output_dir=/shared/runs/x
# NODE_RANK is 0..NNODES-1 (0 on MASTER_ADDR's node); GPUS_PER_NODE defaults to 8, MASTER_PORT to 29500.
# Each node's environment is its own shell's: export HF_HOME etc. the same way on every node.
# train.output_dir must be on storage every node sees at the same path.
set -euo pipefail
cfg=${1:?usage: launch_torchrun_multinode.sh CONFIG.yaml [key=value ...]}; shift
: "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}"
cmd=(torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "${GPUS_PER_NODE:-8}"
     --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}" -m mathrl.cli train "$cfg" "$@")
if [[ "${MATHRL_LAUNCH_DRY_RUN:-0}" == 1 ]]; then echo "${cmd[*]}"; exit 0; fi
exec "${cmd[@]}"
