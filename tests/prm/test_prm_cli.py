"""``mathrl prm label | train | eval`` end to end on SmolLM2 with the real verifier, and its input errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mathrl.prm.cli import PRMInputError, read_records
from mathrl.prm.evaluation import evaluate
from mathrl.procs import without_dist_env

ROOT = Path(__file__).resolve().parents[2]


def test_bad_label_files_name_the_file_line_and_key(tmp_path):
    good = {"problem_id": "p", "gold": "1", "prompt_ids": [1], "response_ids": [2, 3], "correct": True,
            "ends": [1], "hard": [1.0], "soft": [1.0]}
    p = tmp_path / "l.jsonl"
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, "ends": [5]}) + "\n")
    with pytest.raises(PRMInputError, match=r"l.jsonl:2: a step end lies outside the response's 2 tokens"):
        read_records(p)
    p.write_text(json.dumps({**good, "hard": "x"}) + "\n")
    with pytest.raises(PRMInputError, match=r"l.jsonl:1: key 'hard' must be a list"):
        read_records(p)
    with pytest.raises(PRMInputError, match="no such file"):
        read_records(tmp_path / "none.jsonl")


def test_best_of_n_majority_and_random_by_hand():
    """Problem a: responses right (steps 0.9, 0.8), wrong "5" (0.95, 0.1), wrong "5" (0.3): the weakest-step
    pick is the right one (0.8 > 0.3 > 0.1), the majority is "5" (wrong), a random response is right 1/3.
    Problem b: one right response. Steps: 5, hard labels [1, 1, 1, 0, 0, 1]."""
    recs = [{"problem_id": "a", "correct": True, "answer": "7", "hard": [1.0, 1.0]},
            {"problem_id": "a", "correct": False, "answer": "5", "hard": [1.0, 0.0]},
            {"problem_id": "a", "correct": False, "answer": "5", "hard": [0.0]},
            {"problem_id": "b", "correct": True, "answer": "2", "hard": [1.0]}]
    probs = [[0.9, 0.8], [0.95, 0.1], [0.3], [0.7]]
    out = evaluate(recs, probs)
    assert (out["best_of_n"], out["majority"], out["random"]) == (1.0, 0.5, pytest.approx((1 / 3 + 1) / 2))
    assert out["steps"] == 6 and out["step_accuracy"] == pytest.approx(6 / 6)
    assert out["step_auc"] == 1.0
    # kept per problem, so the summary re-derives; the paired difference over problems: a +1, b 0
    assert out["per_problem"] == [
        {"problem_id": "a", "responses": 3, "best_of_n": 1.0, "majority": 0.0, "random": pytest.approx(1 / 3)},
        {"problem_id": "b", "responses": 1, "best_of_n": 1.0, "majority": 1.0, "random": 1.0}]
    d = out["best_minus_majority"]
    assert d["diff"] == 0.5 and d["lo"] == 0.0 and d["hi"] == 1.0
    assert d["mde"] == pytest.approx(2.8016 * (0.5 ** 0.5) / 2 ** 0.5, rel=1e-4)  # sd of [1, 0] = 0.707
    assert out["best_of_n_ci"] == [1.0, 1.0] and out["majority_ci"] == [0.0, 1.0]
    # every step's score is kept, so the whole result re-derives from the kept file and the labels alone
    assert out["step_scores"] == probs
    kept = json.loads(json.dumps(out))
    assert evaluate(recs, kept["step_scores"]) == kept


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_label_train_eval_on_the_real_model(tmp_path, embedded_model_path):
    # without the process-group variables an in-process run earlier in this pytest process left behind (the
    # fresh-clone CI of 76e060d: `mathrl prm train` tried that run's rendezvous and failed)
    env = {**without_dist_env(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "MATHRL_PROGRESS": "0"}
    common = ["configs/demo.yaml", f"model.name={embedded_model_path}", "rollout.backend=hf", "rollout.n=4",
              "rollout.max_tokens=40", "--k", "2", "--problems", "4"]

    def mathrl(*args):
        p = subprocess.run([sys.executable, "-m", "mathrl.cli", "prm", *args], capture_output=True, text=True,
                           timeout=800, cwd=str(ROOT), env=env)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        return p.stdout

    mathrl("label", *common, "--out", str(tmp_path / "train.jsonl"))
    mathrl("label", *common, "--split", "heldout", "--out", str(tmp_path / "held.jsonl"))
    recs = read_records(tmp_path / "train.jsonl")
    assert len(recs) == 16 and all(r["hard"][-1] == float(r["correct"]) for r in recs)
    assert len({len(r["response_ids"]) for r in recs}) > 1 and sum(len(r["ends"]) for r in recs) > len(recs)
    out = mathrl("train", "--labels", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "prm"),
                 "--epochs", "2", "--batch", "8")
    assert "epoch 2/2" in out and (tmp_path / "prm" / "backbone.safetensors").is_file()
    assert read_records(tmp_path / "prm" / "labels.jsonl") == recs  # its training data, for an iterative run's replay
    result = json.loads(mathrl("eval", "--prm", str(tmp_path / "prm"), "--labels", str(tmp_path / "held.jsonl"),
                               "--out", str(tmp_path / "eval.json")))
    assert result["problems"] == 4 and result["steps"] >= 16
    for key in ("step_accuracy", "best_of_n", "majority", "random"):
        assert 0.0 <= result[key] <= 1.0
    kept = json.loads((tmp_path / "eval.json").read_text())
    assert len(kept["per_problem"]) == 4 and sum(p["responses"] for p in kept["per_problem"]) == 16
    assert kept["best_of_n"] == pytest.approx(sum(p["best_of_n"] for p in kept["per_problem"]) / 4)

    # GRPO+PS on that PRM, iterative (DeepSeekMath Algorithm 1): `mathrl train` runs one step and one PRM round on
    # SmolLM2's multi-line responses
    run = tmp_path / "ps"
    p = subprocess.run([sys.executable, "-m", "mathrl.cli", "train", "configs/demo.yaml",
                        f"model.name={embedded_model_path}", "rollout.n=4", "rollout.max_tokens=40", "train.batch_size=2",
                        "train.steps=1", "data.eval_limit=2", "eval.n=1", "eval.k=[1]", "algo.advantage=grpo_ps",
                        f"model.prm={tmp_path / 'prm'}", "algo.prm_update_every=1", "algo.ref_update_every=1",
                        "algo.prm_label_k=1", "algo.prm_batch=4", "logging.log_samples=8", f"train.output_dir={run}",
                        "logging.tensorboard=false", "logging.console=plain"],
                       capture_output=True, text=True, timeout=800, cwd=str(ROOT), env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    row = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"event"' not in x][0]
    assert row["ps/steps_per_response"] > 1.0 and row["prm/records_new"] == 8.0
    # the round replays 10% of the PRM's own training data (its labels.jsonl): round(1.6) = 2 of the 16 records,
    # so 10 responses in batches of 4
    assert row["prm/records_replay"] == 2.0 and row["prm/records_trained"] == 10.0
    assert row["prm/steps_labelled"] > 8 and row["prm/optimizer_steps"] == 3.0
    assert (run / "prm" / "step_000001" / "backbone.safetensors").is_file()
    samples = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and max(len(r["step_rewards"]) for r in samples) > 1
    assert all(r["step_ends"][-1] == r["tokens"] - 1 and r["step_ends"] == sorted(r["step_ends"]) for r in samples)


def test_label_records_become_padded_tensors_by_hand():
    from mathrl.prm.model import records_to_tensors as _tensors

    recs = [{"prompt_ids": [5, 6], "response_ids": [7, 8, 9], "ends": [0, 2], "hard": [1.0, 0.0], "soft": [0.5, 0.0]},
            {"prompt_ids": [4], "response_ids": [3], "ends": [0], "hard": [1.0], "soft": [1.0]}]
    tokens, ends, labels, smask = _tensors(recs, pad=0, target="soft")
    assert tokens.prompt_ids.tolist() == [[5, 6], [0, 4]] and tokens.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert tokens.response_ids.tolist() == [[7, 8, 9], [3, 0, 0]]
    assert tokens.response_mask.tolist() == [[True, True, True], [True, False, False]]
    assert ends.tolist() == [[0, 2], [0, 0]] and labels.tolist() == [[0.5, 0.0], [1.0, 0.0]]
    assert smask.tolist() == [[True, True], [True, False]]
    assert _tensors(recs, pad=0, target="hard")[2].tolist() == [[1.0, 0.0], [1.0, 0.0]]


def test_majority_vote_abstains_without_answers_and_counts_right_answers_together():
    """Problem a: two right answers written differently ("1/2", "0.5": both graded right) outvote one wrong
    "3"; problem b: no response has an answer, so the vote is empty (wrong)."""
    recs = [{"problem_id": "a", "correct": True, "answer": "1/2", "hard": [1.0]},
            {"problem_id": "a", "correct": True, "answer": "0.5", "hard": [1.0]},
            {"problem_id": "a", "correct": False, "answer": "3", "hard": [0.0]},
            {"problem_id": "b", "correct": False, "answer": None, "hard": [0.0]},
            {"problem_id": "b", "correct": False, "answer": "", "hard": [0.0]}]
    out = evaluate(recs, [[0.9], [0.2], [0.8], [0.1], [0.4]])
    assert out["majority"] == 0.5 and out["best_of_n"] == 0.5 and out["random"] == pytest.approx((2 / 3) / 2)


def test_majority_vote_is_mathrl_evals_with_ties_split_and_equivalent_wrong_answers_together():
    """Problem a: right "7", wrong "5", wrong "5.0": with the verifier's equivalence the two wrong answers are
    one class and outvote the right one (0); by strings alone the three classes tie (1/3, the right share of the
    tie, as maj@k scores it). Problem b: right "2", wrong "3": a tie, 1/2 whatever the order."""
    from mathrl.eval.runner import answer_equivalence
    from mathrl.reward import grade_batch

    recs = [{"problem_id": "a", "correct": True, "answer": "7", "hard": [1.0]},
            {"problem_id": "a", "correct": False, "answer": "5", "hard": [0.0]},
            {"problem_id": "a", "correct": False, "answer": "5.0", "hard": [0.0]},
            {"problem_id": "b", "correct": False, "answer": "3", "hard": [0.0]},
            {"problem_id": "b", "correct": True, "answer": "2", "hard": [1.0]}]
    probs = [[0.9], [0.2], [0.3], [0.6], [0.4]]
    verifier = answer_equivalence(lambda r, g, t: grade_batch(r, g, truncated=t))
    by_verifier = evaluate(recs, probs, eq_batch=verifier)["per_problem"]
    assert [p["majority"] for p in by_verifier] == [0.0, 0.5]
    assert [p["majority"] for p in evaluate(recs, probs)["per_problem"]] == [pytest.approx(1 / 3), 0.5]
    assert [p["best_of_n"] for p in by_verifier] == [1.0, 0.0]


def _tiny_prm(folder):
    """A saved PRM (``mathrl prm train``'s layout) of the tiny digit model, untrained."""
    from mathrl.models.value_head import ValueModel
    from mathrl.testing.digits import digit_tokenizer
    from mathrl.testing.tiny import build_tiny_model

    tok = digit_tokenizer()
    build_tiny_model(tok, seed=0, hidden_size=16).save_pretrained(str(folder / "base"))
    tok.save_pretrained(str(folder / "base"))
    ValueModel.from_pretrained(folder / "base").save_pretrained(folder / "prm")
    tok.save_pretrained(str(folder / "prm"))
    return folder / "prm"


def _answer_records(answers, **extra):
    return [{"problem_id": pid, "gold": "7", "correct": ok, "answer": ans, "hard": [float(ok)],
             "soft": [float(ok)], "prompt_ids": [4, 5], "response_ids": [6, 7, 8], "ends": [2], **extra}
            for pid, ok, ans in answers]


def test_evaluate_prm_votes_with_the_verifiers_equivalence(tmp_path):
    """``evaluate_prm`` (the CLI's and the study's path) clusters wrong answers with the verifier: a saved PRM
    of the tiny digit model on the records above (token ids made up): problem a's "5" and "5.0" outvote "7"."""
    from mathrl.prm.evaluation import evaluate_prm

    recs = _answer_records((("a", True, "7"), ("a", False, "5"), ("a", False, "5.0"), ("b", True, "7")))
    out = evaluate_prm(_tiny_prm(tmp_path), recs)
    assert [p["majority"] for p in out["per_problem"]] == [0.0, 1.0] and out["majority"] == 0.5


def test_prm_eval_votes_with_the_tolerance_the_labels_were_graded_with(tmp_path):
    """`mathrl prm eval` on labels graded with reward.rel_tol = 0.01 (kept in each record by the labeller): "5"
    and "5.04" are one wrong answer and outvote "7" (0); labelled with exact numbers they are two (a three-way tie,
    1/3). Records graded with two tolerances are refused in one line."""
    from mathrl.prm.cli import main
    from mathrl.prm.evaluation import evaluate_prm

    prm = _tiny_prm(tmp_path)
    answers = (("a", True, "7"), ("a", False, "5"), ("a", False, "5.04"))
    for tol, vote in ((0.01, 0.0), (0.0, pytest.approx(1 / 3))):
        labels = tmp_path / f"labels_{tol}.jsonl"
        labels.write_text("".join(json.dumps(r) + "\n" for r in _answer_records(answers, rel_tol=tol)))
        assert main(["eval", "--prm", str(prm), "--labels", str(labels), "--out", str(tmp_path / "e.json")]) == 0
        assert json.loads((tmp_path / "e.json").read_text())["per_problem"][0]["majority"] == vote
    mixed = _answer_records(answers[:2], rel_tol=0.01) + _answer_records(answers[2:], rel_tol=0.0)
    with pytest.raises(ValueError, match=r"different reward.rel_tol values \[0.0, 0.01\]"):
        evaluate_prm(prm, mixed)


def test_bad_arguments_are_refused_in_one_line(tmp_path):
    from mathrl.prm.cli import main

    with pytest.raises(PRMInputError, match="--k, --epochs and --batch must be >= 1"):
        main(["label", "configs/demo.yaml", "--out", str(tmp_path / "x.jsonl"), "--k", "0"])
    with pytest.raises(PRMInputError, match="not a PRM folder"):
        main(["eval", "--prm", str(tmp_path), "--labels", str(tmp_path / "x.jsonl")])
