"""reward.stream: the trainer grades each response while the engine still generates the others; the
run is the same as grading the whole batch afterwards (every metric but the timings)."""

from __future__ import annotations

import pytest

from _train_tasks import digit_cfg, digit_problems, step_rows, without_timing

pytestmark = pytest.mark.slow  # every test here takes seconds (make test-fast skips them)


def test_streamed_grading_changes_nothing_but_when(digit_model_dir, tmp_path):
    from mathrl.train import run

    def train(name, *extra):
        cfg = digit_cfg(digit_model_dir, tmp_path / name, "train.steps=2", "rollout.max_tokens=3",
                       "reward.terms={correctness: {}}", *extra)  # the verifier grades
        assert run(cfg, problems=digit_problems(8)) == 0
        return step_rows(tmp_path / name)

    on, off = train("on"), train("off", "reward.stream=false")
    assert [r["reward/graded_during_generation"] for r in on] == [1.0, 1.0]
    assert [r["reward/graded_during_generation"] for r in off] == [0.0, 0.0]
    assert all(0 < r["time/generate_engine_frac"] <= 1 for r in on + off)  # the model's share of generation
    strip = lambda rows: [{k: v for k, v in r.items() if k != "reward/graded_during_generation"}
                          for r in without_timing(rows)]
    assert strip(on) == strip(off)
    # the verdicts themselves (the digit model is seldom right, so compare what the verifier extracted)
    rollouts = [(tmp_path / name / "rollouts.jsonl").read_text() for name in ("on", "off")]
    assert rollouts[0] == rollouts[1] and '"extracted": "' in rollouts[0]
