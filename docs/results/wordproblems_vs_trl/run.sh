#!/usr/bin/env bash
# issue 20 item 2 (word problems): mathrl GRPO vs TRL GRPOTrainer for the same training wall-clock
set -euo pipefail
# run from anywhere: the repo root is three folders up; MATHRL_DATA names the folder holding the
# public sets as JSONL (asdiv/test.jsonl, svamp/test.jsonl; README: "Data")
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
: "${MATHRL_DATA:?set MATHRL_DATA to the folder holding asdiv/test.jsonl and svamp/test.jsonl}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
C=configs/grpo_wordproblems_cpu.yaml
D="data.path=$MATHRL_DATA/asdiv/test.jsonl"
S="algo.dynamic_sampling=false model.autocast=off train.steps=8 logging.tensorboard=false logging.console=plain"
E="data.eval_source=svamp data.eval_limit=300"
echo "=== $(date +%T) mathrl train"
.venv/bin/mathrl train $C $S $D train.save_every=4 train.keep_last=2 data.eval_limit=20 \
    train.output_dir=runs/wp_anchor --resume auto
M=$(.venv/bin/python -c "
import json; r=[json.loads(l) for l in open('runs/wp_anchor/metrics.jsonl')]
print(round(sum(x['time/step'] for x in r if x.get('event') in (None,'step') and 'time/step' in x)/60, 2))")
H=$(.venv/bin/python -c "print(round($M/2, 2))")
echo "=== $(date +%T) TRL train for $M min (save every $H)"
[ -f runs/trl_wp/done ] || { .venv/bin/python scripts/trl_anchor.py train --config $C --minutes $M \
    --save-every-minutes $H --out runs/trl_wp $S $D && touch runs/trl_wp/done; }
echo "=== $(date +%T) mathrl series"
.venv/bin/mathrl eval --config $C --series runs/wp_anchor --out runs/wp_anchor/series $D $E
mkdir -p runs/trl_wp/series; cp -rn runs/wp_anchor/series/step_000000 runs/trl_wp/series/
echo "=== $(date +%T) TRL series"
.venv/bin/mathrl eval --config $C --series runs/trl_wp --out runs/trl_wp/series $D $E
echo "=== $(date +%T) done"
