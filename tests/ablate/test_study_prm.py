"""A study's process-supervised rows (issue 41, point 5): with ``study.prm`` the driver trains the initial PRM once
(the initial policy's samples of the first training problems, labelled, then fitted) into ``<out>/prm_initial``,
and every grpo_ps row without its own ``model.prm`` trains on it, the plain one and the iterative one."""

from __future__ import annotations

import json

import pytest
import yaml
from _ablate_tasks import digit_problems

from mathrl.ablate import Task, run_study
from mathrl.ablate.study import DONE, load_study, run_config
from mathrl.config import ConfigError
from mathrl.rollout import make_engine
from mathrl.testing.digits import first_digit_grader


def _write(tmp_path, model_dir, prm=True):
    study = {
        "study": {"name": "ps", "out": str(tmp_path / "study"),
                  **({"prm": {"problems": 8, "k": 2, "epochs": 1, "batch": 8, "heldout": 4}} if prm else {})},
        "base": {
            "model": {"name": str(model_dir)},
            "data": {"template": "chat_boxed"},
            "rollout": {"backend": "hf", "n": 4, "max_tokens": 3, "temperature": 1.0},
            "train": {"steps": 2, "batch_size": 4, "lr": 1.0e-2, "seed": 0, "save_every": 1, "keep_last": 3},
            "deepspeed": {"zero_stage": 1},
            "logging": {"tensorboard": False, "console": "plain"},
            "reward": {"workers": 1},
            "eval": {"n": 4, "k": [1, 4], "max_tokens": 1, "greedy": True, "temperature": 1.0, "top_p": 1.0},
        },
        "runs": [{"method": "grpo_ps"},
                 {"method": "grpo_ps", "name": "grpo_ps-iterative",
                  "overrides": {"algo.prm_update_every": 1, "algo.ref_update_every": 1, "algo.prm_label_k": 1}}],
    }
    path = tmp_path / "ps.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.mark.slow
def test_the_study_trains_the_initial_prm_once_for_its_ps_rows(tmp_path, digit_model_dir, monkeypatch):
    path = _write(tmp_path, digit_model_dir)
    import mathrl.prm.pipeline as pipeline

    started = []  # the labelling engines started (the real ones): one for the training and held-out problems
    monkeypatch.setattr(pipeline, "make_engine", lambda *a, **kw: started.append(a) or make_engine(*a, **kw))
    task = Task(train_problems=digit_problems(32), eval_problems=digit_problems(10, offset=100), eval_name="digits",
                reward_terms={"first_digit": {}}, grader=first_digit_grader)
    logs: list[str] = []
    report = run_study(path, task=task, log=logs.append)
    out = tmp_path / "study"
    prm = out / "prm_initial"
    assert (prm / "backbone.safetensors").is_file() and not (out / "prm_initial.tmp").exists()
    labels = [json.loads(x) for x in (prm / "labels.jsonl").read_text().splitlines()]
    assert len(labels) == 8 * 4 and {r["problem_id"] for r in labels} == {f"digit/{i}" for i in range(8)}
    assert sum("initial PRM: labelling" in m for m in logs) == 1  # once, for both rows
    assert len(started) == 1, started  # the held-out problems are labelled on the same engine
    # measured on the first 4 held-out problems, labelled the same way; the figures re-derive from the picks kept
    held = [json.loads(x) for x in (prm / "heldout_labels.jsonl").read_text().splitlines()]
    assert len(held) == 4 * 4 and {r["problem_id"] for r in held} == {f"digit/{i}" for i in range(100, 104)}
    ev = json.loads((prm / "heldout_eval.json").read_text())
    assert [p["problem_id"] for p in ev["per_problem"]] == [f"digit/{i}" for i in range(100, 104)]
    for key in ("best_of_n", "majority", "random"):
        assert ev[key] == pytest.approx(sum(p[key] for p in ev["per_problem"]) / 4)
    assert ev["steps"] == sum(len(r["ends"]) for r in held)
    assert sum("initial PRM on 4 held-out problems: step AUC" in m for m in logs) == 1
    md = (out / "report.md").read_text()
    assert "## The initial PRM on 4 held-out problems (prm_initial/heldout_eval.json)" in md
    assert report["prm_heldout"]["best_of_n"] == ev["best_of_n"] and "per_problem" not in report["prm_heldout"]
    assert [r["name"] for r in report["runs"]] == ["grpo_ps", "grpo_ps-iterative"]
    for name in ("grpo_ps", "grpo_ps-iterative"):
        assert (out / name / DONE).is_file()
        assert yaml.safe_load((out / name / "config.yaml").read_text())["model"]["prm"] == str(prm)
        rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines() if '"event"' not in x]
        assert len(rows) == 2 and all("ps/step_reward_mean" in r for r in rows)
    assert (out / "grpo_ps-iterative" / "prm" / "step_000002").is_dir()
    # a run's own model.prm wins; without study.prm a grpo_ps row without one is refused at load, with the fix
    assert run_config(load_study(path), load_study(path).run("grpo_ps")).model.prm == str(prm)
    (tmp_path / "noprm").mkdir()
    with pytest.raises(ConfigError, match=r"model.prm is not set.*study.prm"):
        load_study(_write(tmp_path / "noprm", digit_model_dir, prm=False))


def test_study_prm_options_are_checked(tmp_path, digit_model_dir):
    path = _write(tmp_path, digit_model_dir)
    data = yaml.safe_load(path.read_text())
    for bad, msg in (({"problems": 0}, r"study.prm.problems = 0; allowed: an integer >= 1"),
                     ({"lr": -1}, r"study.prm.lr = -1; allowed: a number > 0"),
                     ({"heldout": -1}, r"study.prm.heldout = -1; allowed: an integer >= 0"),
                     ({"probs": 3}, r"study.prm must be a mapping with keys among problems, k, epochs, lr, batch, "
                                    r"heldout")):
        data["study"]["prm"] = bad
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError, match=msg):
            load_study(path)
    data["study"]["prm"] = {"problems": 4}
    path.write_text(yaml.safe_dump(data))
    assert load_study(path).prm == {"problems": 4, "k": 4, "epochs": 2, "lr": 1e-5, "batch": 16, "heldout": 0}


def test_the_prm_section_by_hand():
    from mathrl.ablate.report import prm_section

    assert prm_section({"runs": []}) == []
    e = {"problems": 40.0, "steps": 310.0, "step_accuracy": 0.7, "step_auc": 0.8123, "best_of_n": 0.3,
         "majority": 0.25, "random": 0.2, "best_of_n_ci": [0.15, 0.45], "majority_ci": [0.125, 0.4],
         "best_minus_majority": {"diff": 0.05, "lo": -0.05, "hi": 0.15, "p_le_0": 0.2, "mde": 0.1234}}
    lines = prm_section({"prm_heldout": e})
    assert lines[1] == "## The initial PRM on 40 held-out problems (prm_initial/heldout_eval.json)"
    assert lines[-1] == "| 70.0 | 0.812 | 310 | 30.0 [15.0, 45.0] | 25.0 [12.5, 40.0] | 20.0 | +5.0 [-5.0, +15.0] | 12.3 |"
