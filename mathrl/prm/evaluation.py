"""A process reward model measured on labelled held-out responses (``mathrl prm eval`` and the study's initial
PRM): step accuracy and AUC against the steps' hard labels, and best-of-N reranking per problem -- the response
whose weakest step scores highest (Math-Shepherd's min) -- against majority voting and a random response.

Every figure comes with what it rests on: per problem, whether the PRM's pick, the majority answer and a random
response are right (``per_problem``), the PRM's score of every step of every record (``step_scores``, in the
records' order: :func:`evaluate` of the labelled records and these scores gives the whole result again, with no
PRM weights), bootstrap intervals over problems, and the paired difference best-of-N minus majority with its
interval, one-sided bootstrap p-value and the smallest difference the problems could detect (80% power,
:func:`mathrl.eval.metrics.min_detectable_diff`).
"""

from __future__ import annotations

from pathlib import Path

from mathrl.algo.process import roc_auc
from mathrl.eval.metrics import bootstrap_ci, maj_at_k, min_detectable_diff, paired_bootstrap_diff, sample_sd
from mathrl.eval.runner import answer_equivalence, cluster_answers_batch
from mathrl.models import load_tokenizer
from mathrl.models.value_head import ValueModel
from mathrl.prm.model import records_to_tensors
from mathrl.reward import grade_batch
from mathrl.reward.options import GradeOptions
from mathrl.train.process import prm_scores

__all__ = ["evaluate", "evaluate_prm", "evaluate_scored", "score_records"]


def score_records(prm, tokenizer, records: list[dict], *, token_budget: int = 8192, device="cpu") -> list[list[float]]:
    """The PRM's probability of each labelled step of each record (read where the step ends)."""
    tokens, ends, _, smask = records_to_tensors(records, tokenizer.pad_token_id, "hard")
    p = prm_scores(prm, tokens, ends, smask, token_budget=token_budget, device=device)
    return [p[i, : len(r["ends"])].tolist() for i, r in enumerate(records)]


def evaluate(records: list[dict], probs: list[list[float]], *, eq_batch=None, resamples: int = 2000,
             seed: int = 0) -> dict:
    """The figures of the module docstring from labelled records and the PRM's step probabilities ``probs``
    (one list per record). Majority voting as ``mathrl eval`` scores it (maj@N over all N responses of the
    problem, :func:`mathrl.eval.metrics.maj_at_k`): the right answers vote together, wrong ones in classes of
    equivalent answers (:func:`mathrl.eval.metrics.cluster_answers`; ``eq_batch(pairs) -> list[bool]``, e.g.
    :func:`mathrl.eval.runner.answer_equivalence` of the verifier; default: equal strings only), responses
    without an answer abstain, a tie scores the right share of the tied classes and an empty vote is wrong.
    ``random`` is the mean accuracy."""
    flat = [(p, h) for rec, ps in zip(records, probs) for p, h in zip(ps, rec["hard"])]
    out: dict = {"steps": float(len(flat)),
                 "step_accuracy": sum((p > 0.5) == (h > 0.5) for p, h in flat) / len(flat),
                 "step_auc": roc_auc([p for p, _ in flat], [h > 0.5 for _, h in flat])}
    by_problem: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        by_problem.setdefault(rec["problem_id"], []).append(i)
    groups = list(by_problem.items())
    classes = cluster_answers_batch([[records[i].get("answer") for i in rows] for _, rows in groups],
                                    [[bool(records[i]["correct"]) for i in rows] for _, rows in groups],
                                    eq_batch or (lambda pairs: [False] * len(pairs)))
    per = []
    for (pid, rows), (labels, right) in zip(groups, classes):
        pick = max(rows, key=lambda i: min(probs[i]) if probs[i] else 0.0)
        per.append({"problem_id": pid, "responses": len(rows), "best_of_n": float(records[pick]["correct"]),
                    "majority": maj_at_k(labels, right, len(rows)),
                    "random": sum(records[i]["correct"] for i in rows) / len(rows)})
    best, vote_, mean = ([p[key] for p in per] for key in ("best_of_n", "majority", "random"))
    diff = paired_bootstrap_diff(vote_, best, resamples=resamples, seed=seed)
    out.update({"problems": float(len(per)), "best_of_n": sum(best) / len(best), "majority": sum(vote_) / len(vote_),
                "random": sum(mean) / len(mean),
                "best_of_n_ci": list(bootstrap_ci(best, resamples=resamples, seed=seed)),
                "majority_ci": list(bootstrap_ci(vote_, resamples=resamples, seed=seed)),
                "best_minus_majority": {**diff, "mde": min_detectable_diff(
                    sample_sd([b - v for b, v in zip(best, vote_)]), len(per))},
                "per_problem": per, "step_scores": [list(map(float, p)) for p in probs]})
    return out


def evaluate_scored(records: list[dict], step_scores: list[list[float]], *, options: GradeOptions | None = None
                    ) -> dict:
    """:func:`evaluate` of ``records`` scored ``step_scores`` with wrong answers voting together when the verifier
    finds them equal, with ``options`` (the run's ``reward.*``; None: the tolerance ``rel_tol`` the records were
    graded with, as ``mathrl prm label`` keeps it, else the default). A kept result re-derives from its labelled
    records and its own ``step_scores`` by this function."""
    if options is None:
        tols = {float(r.get("rel_tol", 0.0)) for r in records}
        if len(tols) > 1:
            raise ValueError(f"the labelled records were graded with different reward.rel_tol values {sorted(tols)}; "
                             "allowed: one tolerance per evaluation (evaluate the files apart)")
        options = GradeOptions(rel_tol=tols.pop() if tols else 0.0)
    eq_batch = answer_equivalence(lambda r, g, t: grade_batch(r, g, options, truncated=t))
    return evaluate(records, step_scores, eq_batch=eq_batch)


def evaluate_prm(prm_folder: str | Path, records: list[dict], *, token_budget: int = 8192,
                 options: GradeOptions | None = None) -> dict:
    """:func:`evaluate_scored` of ``records`` scored by the PRM saved in ``prm_folder`` (``mathrl prm train``'s
    output)."""
    prm = ValueModel.from_pretrained(prm_folder)
    tok = load_tokenizer(str(prm_folder))
    return evaluate_scored(records, score_records(prm, tok, records, token_budget=token_budget), options=options)
