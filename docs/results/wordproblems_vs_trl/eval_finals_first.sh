#!/usr/bin/env bash
# finals first, then the intermediate checkpoints (series reuses finished steps)
set -euo pipefail
# run from anywhere: the repo root is three folders up; MATHRL_DATA names the folder holding the
# public sets as JSONL (asdiv/test.jsonl, svamp/test.jsonl; README: "Data")
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
: "${MATHRL_DATA:?set MATHRL_DATA to the folder holding asdiv/test.jsonl and svamp/test.jsonl}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
C=configs/grpo_wordproblems_cpu.yaml
D="data.path=$MATHRL_DATA/asdiv/test.jsonl"
E="data.eval_source=svamp data.eval_limit=300"
mkdir -p runs/held
[ -d runs/wp_anchor/checkpoints/step_000004 ] && mv runs/wp_anchor/checkpoints/step_000004 runs/held/
[ -d runs/trl_wp/checkpoint-1 ] && mv runs/trl_wp/checkpoint-1 runs/held/
series() {
  echo "=== $(date +%T) series $1"
  .venv/bin/mathrl eval --config $C --series runs/$1 --out runs/$1/series $D $E
  mkdir -p runs/trl_wp/series; cp -rn runs/wp_anchor/series/step_000000 runs/trl_wp/series/
}
series wp_anchor; series trl_wp
mv runs/held/step_000004 runs/wp_anchor/checkpoints/; mv runs/held/checkpoint-1 runs/trl_wp/
series wp_anchor; series trl_wp
echo "=== $(date +%T) done"
