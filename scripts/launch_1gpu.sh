#!/usr/bin/env bash
# One GPU: GRPO with DeepSpeed ZeRO-2 and vLLM colocated on the same device.
#   bash scripts/launch_1gpu.sh configs/grpo_gsm8k.yaml [key=value ...]
set -euo pipefail
cfg=${1:?usage: launch_1gpu.sh CONFIG.yaml [key=value ...]}; shift
exec deepspeed --num_gpus 1 --module mathrl.cli train "$cfg" "$@"
