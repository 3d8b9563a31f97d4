#!/usr/bin/env bash
# Several nodes through DeepSpeed's launcher and a hostfile (one line per node: "host slots=8").
# Every node needs the same repo path and environment. train.output_dir must be on storage every node
# sees at the same path (NFS, Lustre, ...): rank 0 writes checkpoints after a barrier, and on resume
# every rank reads them.
#   bash scripts/launch_multinode.sh hostfile configs/grpo_math.yaml train.output_dir=/shared/runs/x
#
# DeepSpeed's multi-node runner (pdsh/ssh) forwards only a few variables to the other nodes; the rest
# must be listed in .deepspeed_env in the launch directory. This script writes it from the variables
# set here that mathrl, Hugging Face, NCCL and vLLM read (HF_HOME, MATHRL_*, NCCL_*, ...), so the remote
# ranks find the same caches and settings. MATHRL_LAUNCH_DRY_RUN=1 prints the file and the command
# instead of launching.
set -euo pipefail
hostfile=${1:?usage: launch_multinode.sh HOSTFILE CONFIG.yaml [key=value ...]}; shift
cfg=${1:?usage: launch_multinode.sh HOSTFILE CONFIG.yaml [key=value ...]}; shift
prefixes='^(HF_|HUGGING_FACE_|TRANSFORMERS_|MATHRL_|NCCL_|VLLM_|CUDA_|TORCH_|OMP_NUM_THREADS|TOKENIZERS_PARALLELISM|PYTHONPATH|WANDB_)'
env_file=.deepspeed_env
env | grep -E "$prefixes" | grep -v '^MATHRL_LAUNCH_DRY_RUN=' | sort > "$env_file.tmp" || true
mv "$env_file.tmp" "$env_file"
cmd=(deepspeed --hostfile "$hostfile" --module mathrl.cli train "$cfg" "$@")
if [[ "${MATHRL_LAUNCH_DRY_RUN:-0}" == 1 ]]; then
  echo "# $env_file"; cat "$env_file"; echo "# command"; echo "${cmd[*]}"; exit 0
fi
exec "${cmd[@]}"
