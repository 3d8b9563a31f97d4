#!/usr/bin/env bash
# The GPU check, in one command (at most 7 minutes on one H200, machine start-up aside):
#
#   bash scripts/gpu_check.sh                      # on the GPU machine, repo root; device tool: carry gpu_wheels
#   bash scripts/gpu_check.sh --device cpu --out-dir /tmp/gc    # every step's code path on CPU, tiny shapes (CI)
#   python scripts/gpu_check.py --report-only --out-dir DIR     # the table again from DIR/gpu_check.jsonl
#
# 1. installs the wheelhouse gpu_wheels/ (built beforehand by scripts/gpu_wheelhouse.sh): offline,
#    no dependencies resolved, only the packages this Python lacks (typing_extensions also when older);
# 2. runs scripts/gpu_check.py with the arguments given. Each step runs in its own subprocess under its
#    own wall-clock limit and appends one JSON line (name, ok, seconds, details) to
#    <out-dir>/gpu_check.jsonl as it ends (default out-dir: runs/gpu_check), so a run cut off still
#    reports; a step whose estimate does not fit in what is left of --budget-s (default 390 s) is
#    recorded as 'skipped: budget'. Steps, on a random Qwen2.5-0.5B-shaped model with an 8192-token
#    vocabulary in bf16: packages; mathrl.algo on CUDA vs CPU; GRPO under ZeRO-3 through
#    `deepspeed --num_gpus 1 --module mathrl.cli train` with gradient checkpointing and a NaN step that
#    must be skipped; the same run under `torchrun --nproc_per_node 1 -m mathrl.cli train` SIGKILLed
#    after its step-2 checkpoint and resumed (--resume auto), bitwise against the uninterrupted run;
#    LoRA under ZeRO-3; the memory guard's estimate vs torch.cuda.max_memory_allocated at 3 shapes; a
#    run beside a ballast tensor (vLLM's share): its fitted micro-batch budget must drop, no OOM; bf16
#    vs fp32 accumulation of 16 micro-batch gradients vs float64; `mathrl eval` (hf) on the GPU;
#    scripts/bench_gpu.py; last, if time is left, ZeRO-2 with the optimizer offloaded.
#    gpu_check.md (the table) is rebuilt from the JSONL at the end.
#
# Environment: PYTHON (default: python3, else python), WHEELHOUSE (default: gpu_wheels).
# Exit status: 0 all passed, 1 a check failed, 2 no GPU, 3 packages missing and no wheelhouse.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python)}
WH=${WHEELHOUSE:-gpu_wheels}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
start=$(date +%s)

if compgen -G "$WH/*.whl" > /dev/null; then
  # the wheels whose distribution this Python lacks (or, for typing_extensions, has older)
  mapfile -t todo < <("$PY" - "$WH" <<'EOF'
import sys
from importlib import metadata
from pathlib import Path

def key(v):
    return tuple(int(x) if x.isdigit() else 0 for x in v.split("+")[0].split("."))

seen = set()
for whl in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, version = whl.name.split("-")[:2]
    norm = name.lower().replace("_", "-")
    if norm in seen:
        continue
    seen.add(norm)
    try:
        have = metadata.version(norm)
    except metadata.PackageNotFoundError:
        print(f"{norm}=={version}")
        continue
    if norm == "typing-extensions" and key(have) < key(version):
        print(f"{norm}=={version}")
EOF
)
  if (( ${#todo[@]} )); then
    echo "gpu_check.sh: installing from $WH/: ${todo[*]}"
    "$PY" -m pip install -q --no-index --no-deps --find-links "$WH" "${todo[@]}"
  else
    echo "gpu_check.sh: every package of $WH/ is already installed"
  fi
else
  echo "gpu_check.sh: no wheelhouse at $WH/ (build it with: bash scripts/gpu_wheelhouse.sh); using what is installed"
fi

set +e
"$PY" scripts/gpu_check.py --preflight
rc=$?
set -e
if (( rc != 0 )); then
  if ! compgen -G "$WH/*.whl" > /dev/null; then
    echo "gpu_check.sh: ERROR: the wheelhouse $WH/ is missing and this Python ($PY) lacks packages the check" \
         "needs (listed above). Build it where PyPI is reachable: bash scripts/gpu_wheelhouse.sh; then carry" \
         "$WH/ with the working tree (device tool: carry [\"$WH\"])." >&2
  fi
  exit "$rc"
fi
set +e
"$PY" scripts/gpu_check.py "$@"
rc=$?
set -e
echo "gpu_check.sh: exit $rc after $(( $(date +%s) - start )) s"
exit "$rc"
