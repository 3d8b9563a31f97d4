#!/usr/bin/env bash
# The evaluation-speed benchmark as it ran for docs/results/bench_eval (issue 40, point 4), from the
# repository root, nothing else running on the machine. MATHRL_DATA: the folder holding svamp/test.jsonl.
set -euo pipefail
: "${MATHRL_DATA:?set MATHRL_DATA to the folder holding svamp/test.jsonl}"
OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_eval.py --data "$MATHRL_DATA/svamp/test.jsonl" \
    --source svamp --limit 200 --repeats 2 --json bench_eval.json
