#!/usr/bin/env bash
# Several nodes through DeepSpeed's launcher and a hostfile (one line per node: "host slots=8").
# Every node needs the same repo path and environment. train.output_dir must be on storage every node
# sees at the same path (NFS, Lustre, ...): rank 0 writes checkpoints after a barrier, and on resume
# every rank reads them.
#   bash scripts/launch_multinode.sh hostfile configs/grpo_math.yaml train.output_dir=/shared/runs/x
#
# DeepSpeed's multi-node runner (pdsh/ssh) starts the remote ranks with only a few variables of this
# shell (NCCL_*, PYTHON*, ...); everything else must be listed in a "deepspeed_env" file, which the runner
# reads on this node (DeepSpeed reads $DS_ENV_FILE, default .deepspeed_env, in ~ and in the current
# folder) and turns into `export` commands for the remote shells. This script writes that file from the
# variables set here that mathrl, Hugging Face, NCCL, vLLM and W&B read (HF_HOME, HF_TOKEN, MATHRL_*,
# NCCL_*, WANDB_API_KEY, ...), so the remote ranks find the same caches, settings and credentials.
# Because it can hold tokens, the file is not written into the work tree: it goes to a private folder
# (mktemp -d, mode 700; the file mode 600), DS_ENV_FILE points DeepSpeed at it, and it is removed when
# the launcher exits. A ~/.deepspeed_env of your own is copied in first (this script's values win).
# MATHRL_LAUNCH_DRY_RUN=1 prints the file (secret values masked) and the command instead of launching.
set -euo pipefail
hostfile=${1:?usage: launch_multinode.sh HOSTFILE CONFIG.yaml [key=value ...]}; shift
cfg=${1:?usage: launch_multinode.sh HOSTFILE CONFIG.yaml [key=value ...]}; shift
prefixes='^(HF_|HUGGING_FACE_|TRANSFORMERS_|MATHRL_|NCCL_|VLLM_|CUDA_|TORCH_|OMP_NUM_THREADS|TOKENIZERS_PARALLELISM|PYTHONPATH|WANDB_)'
secret='^[^=]*(TOKEN|KEY|SECRET|PASSWORD)[^=]*='
umask 077
env_dir=$(mktemp -d "${TMPDIR:-/tmp}/mathrl-deepspeed-env.XXXXXX")
trap 'rm -rf "$env_dir"' EXIT
env_file=$env_dir/deepspeed_env
{
  if [[ -f "$HOME/.deepspeed_env" ]]; then cat "$HOME/.deepspeed_env"; fi
  env | grep -E "$prefixes" | grep -v -E '^(MATHRL_LAUNCH_DRY_RUN|DS_ENV_FILE)=' | sort || true
} > "$env_file"
export DS_ENV_FILE=$env_file
cmd=(deepspeed --hostfile "$hostfile" --module mathrl.cli train "$cfg" "$@")
if [[ "${MATHRL_LAUNCH_DRY_RUN:-0}" == 1 ]]; then
  echo "# DS_ENV_FILE=$env_file (mode 600, removed when the launcher exits)"
  sed -E "s/($secret).*/\1<set>/" "$env_file"
  echo "# command"; printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
# not exec: this shell stays to remove the file; it passes INT/TERM/HUP on to the launcher (a background
# job of a script ignores SIGINT, so Ctrl-C arrives through the trap) and exits with its status
"${cmd[@]}" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM HUP
status=0
while :; do
  wait "$child" && status=0 || status=$?
  kill -0 "$child" 2>/dev/null || break
done
exit "$status"
