#!/usr/bin/env bash
# One node, 8 GPUs: data-parallel rollout and training (each rank samples its share of
# train.batch_size prompts; gradients are all-reduced by DeepSpeed). batch_size and
# mini_batch_size must be divisible by 8.
#   bash scripts/launch_8gpu.sh configs/grpo_math.yaml deepspeed.zero_stage=3
set -euo pipefail
cfg=${1:?usage: launch_8gpu.sh CONFIG.yaml [key=value ...]}; shift
exec torchrun --standalone --nproc_per_node 8 -m mathrl.cli train "$cfg" "$@"
