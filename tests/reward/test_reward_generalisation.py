"""Answers written the way models and other graders write them (the categories of the verifier's
generalisation work), the answer policy (last committed answer wins, hedging, unfinished responses),
math-verify as a second opinion, and accuracy on labelled sets this project did not write.

Cases marked "public" come from other graders' public test suites (see eval/verifier_sets/README.md);
the others are this project's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mathrl.reward.extract import extract_answer
from mathrl.reward.grader import grade_local
from mathrl.reward.second_opinion import math_verify_equal, second_opinion_applies

ROOT = Path(__file__).resolve().parents[2]
SETS = ROOT / "eval" / "verifier_sets"


def _P(*rows) -> str:
    """A pmatrix with these rows."""
    return "\\begin{pmatrix}" + "\\\\".join("&".join(map(str, r)) for r in rows) + "\\end{pmatrix}"


# (gold, whole response, expected)
CATEGORIES = {
    "bare answers": [
        ("\\frac{10}{9}", "\\frac{10}{9}", True),  # public (Math-Verify)
        ("0.4", ".4", True),
        ("5", "3+2", True),
        ("(3,2)", "(p,q)=(3,2)", True),
        ("4, 5", "AB=4, CD=5", True),
        ("\\mathcal{B}", "\\mathcal B", True),
        ("odd", "$odd$", True),  # public (MARIO_EVAL)
    ],
    "number formats": [
        ("1000", "1 000", True),  # public (Math-Verify)
        ("11111111100", "11,\\! 111,\\! 111,\\! 100", True),  # public (Math-Verify)
        ("1000.99", "1,000.99m^2", True),
        ("\\frac{1}{3}", "0.\\overline{3}", True),
        ("\\frac{7}{9}", "The answer is $0.(7)$.", True),
        ("\\frac{3}{2}", "1\\frac12", True),
        ("2000000", "2 million", True),
        ("7", "The answer is seven.", True),
        ("25", "The answer is twenty-five.", True),
        ("185", "185\\", True),  # public (AReaL)
        ("\\frac{1}{3}", "0.333", False),  # exact rationals: an approximation is not the value
    ],
    "answer markers": [
        ("34", "Final Answer: The largest $n$ is 34.", True),  # public (Math-Verify)
        ("10455", "We get \\boxed{3} and \\boxed{5}. The final answer is $10,455$", True),
        ("5", "答案是 5", True),
        ("5", "Réponse : 5", True),
        ("44", "So $17^{-1}\\equiv \\boxed{44}$.\n\nWe may check our answer: $17\\cdot 44 = 748$.", True),
    ],
    "relations": [
        ("11:21", "V_1:V_2=11:21", True),  # public (MindSpeed-RL)
        ("11", "x\\approx11", True),
        ("x<1", "-x>-1", True),
        ("(-\\infty, 0)", "x<0", True),
        ("(p,q)=(3,2)", "(3,2)", True),  # a gold that names its value: the value counts
        ("V_{1}:V_{2}=11:21", "11:21", True),
        ("|AB|=1", "1", True),
        ("2x+z=1", "1", False),  # an equation is not a name for its right side
        ("a^2+b=0", "0", False),
    ],
    "sets, lists and matrices": [
        ("\\pm 2021", "\\{-2021, 2021\\}", True),
        ("$${1,2,3}$$", "\\boxed{1} and \\boxed{2} and \\boxed{3}", True),  # public (Math-Verify)
        ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\left[\\begin{array}{cc}1&2\\\\3&4\\end{array}\\right]", True),
        ("\\begin{pmatrix} -7 & 6 \\\\ 11 & -9 \\end{pmatrix}", "\\begin{bmatrix}\n -7 & 6 \\\\\n 11 & -9\n\\end{bmatrix}",
         True),  # public (Math-Verify)
        ("\\begin{matrix} \\frac12 \\\\ 1 \\end{matrix}", "[0.5, 1]", True),  # public (Math-Verify)
        ("\\boxed{1} papers and \\boxed{2} bins", "$\\boxed{1,2}$", True),  # public (slime)
        ("\\mathbb{R}", "(-\\infty, \\infty)", True),
        ("(-\\infty,\\infty)", "The answer is all real numbers.", True),
        ("\\emptyset", "\\varnothing", True),
        ("\\emptyset", "\\{\\}", True),
        ("\\{1\\}", "\\{\\}", False),
        # matrix arithmetic written out is evaluated (sums, scalar multiples, products in order)
        (_P([4], [6]), "$\\boxed{" + _P([1], [2]) + "+" + _P([3], [4]) + "}$", True),
        (_P([4], [6]), "$\\boxed{" + _P([1], [2]) + "+" + _P([3], [5]) + "}$", False),
        (_P([2, 4], [6, 8]), "$\\boxed{2" + _P([1, 2], [3, 4]) + "}$", True),
        (_P([2, 1], [4, 3]), "$\\boxed{" + _P([1, 2], [3, 4]) + _P([0, 1], [1, 0]) + "}$", True),
        (_P([2, 1], [4, 3]), "$\\boxed{" + _P([0, 1], [1, 0]) + _P([1, 2], [3, 4]) + "}$", False),
        (_P([0], [0]), "$\\boxed{" + _P([1], [2]) + "-" + _P([1], [2]) + "}$", True),
        (_P(["\\sqrt2"], [2]), "$\\boxed{\\sqrt{2}" + _P([1], ["\\sqrt2"]) + "}$", True),
        ("(4,6)", "$\\boxed{" + _P([1], [2]) + "+" + _P([3], [4]) + "}$", True),
        (_P([1], [2]) + "+" + _P([3], [4]), "$\\boxed{" + _P([4], [6]) + "}$", True),
        (_P([3], [5]), "$\\boxed{" + _P([1], [2]) + "+" + _P([1, 2]) + "}$", False),  # shapes differ
        (_P([3], [5]), "$\\boxed{" + _P([1], [2]) + "+x}$", False),
    ],
    "latex shorthand": [
        ("\\sqrt[3]{2}", "\\sqrt[3]2", True),
        ("\\frac{1}{2}", "\\dfrac{1}{\\,2}", True),
        ("\\cos x", "\\sin(90^\\circ-x)", True),
        ("$x_{1}=1,\\quadx_{2}=2$", "\\boxed{1} \\quad \\text{and} \\quad \\boxed{2}", True),
        ("$\\\\left(\\\\frac{4}{5},\\\\frac{1}{5}\\\\right)$", "$\\boxed{\\left(\\frac{4}{5},\\frac{1}{5}\\right)}$", True),
    ],
    "units and times": [
        ("10", "10weeks", True),
        ("10", "10 m", True),
        ("10", "10m", True),
        ("10", "10cm", True),
        ("5", "5只", True),
        ("5", "5 (which is 500 cents)", True),
        ("20:34", "20:34:00", True),
        ("7:30", "The train leaves at 7:30 pm.", True),
    ],
    "false positives": [
        ("12:00", "1:00", False),  # public (Math-Verify)
        ("E", "\\mathrm{E}*2", False),
        ("7", "First we add 3 and 4 to get 7 and then we multiply by", False),
        ("4", "$x = 4$ is not the answer.", False),
        ("4", "So the result is $\\boxed{4 \\text{ hours and } 30 \\text{ minutes}}$", False),
        ("\\frac{1}{2^{99}}", "$\\boxed{\\frac{1}{2^{98}}}$", False),
    ],
}


@pytest.mark.parametrize("gold,response,expected",
                         [c for cases in CATEGORIES.values() for c in cases],
                         ids=[f"{cat}:{i}" for cat, cases in CATEGORIES.items() for i in range(len(cases))])
def test_categories(gold, response, expected):
    g = grade_local(response, gold)
    assert g.correct is expected, (g.extracted, g.reason)


def test_the_last_committed_answer_wins():
    # a final-answer statement after intermediate boxes
    assert extract_answer("\\boxed{3} and \\boxed{5}. The final answer is $10,455$").answer == "10,455"
    # a self-correction between boxes withdraws the earlier box
    corr = extract_answer("So \\boxed{12}. Wait, I made a mistake: 3 + 4 = 7, so \\boxed{7}.")
    assert corr.answer == "7" and not corr.hedged
    # a later '#### N' line overrides an earlier box
    assert extract_answer("\\boxed{3}\n#### 4").answer == "4"
    # a bare "answer:" after a box (a check, not a new answer) does not override it
    assert extract_answer("\\boxed{44}. We may check our answer: $17 \\cdot 44 = 748$.").answer == "44"


def test_a_box_announced_as_final_is_not_a_hedge():
    """Issue 38 point 9: an intermediate box, then the announced final one, scored 0 as a hedge."""
    text = "First we get $\\boxed{10}$. Then the final answer is $\\boxed{42}$."
    ex = extract_answer(text)
    assert ex.answer == "42" and not ex.hedged
    assert grade_local(text, "42").correct and not grade_local(text, "10").correct
    assert extract_answer("So $x = \\boxed{3}$, and the answer is $\\boxed{7}$.").answer == "7"
    # an announcement before both boxes is still a hedge, and so is one before the last two
    for hedge in ("The answer is \\boxed{10} or \\boxed{42}.",
                  "We get \\boxed{5}. So the answer is either \\boxed{10} or \\boxed{42}."):
        h = extract_answer(hedge)
        assert h.hedged and h.answer == "10, 42", hedge
        assert not grade_local(hedge, "42").correct


def test_hedging_is_not_credited():
    h = extract_answer("It is either \\boxed{3} or \\boxed{4}.")
    assert h.hedged and h.answer == "3, 4"
    assert not grade_local("It is either \\boxed{3} or \\boxed{4}.", "3").correct
    assert not grade_local("The answer is 3 or 4.", "3").correct
    # hedged answers never go to the second opinion
    assert not second_opinion_applies("3", "3, 4", hedged=True)


def test_unfinished_responses_have_no_answer():
    assert extract_answer("4 * 3 = 12 and then we", truncated=False).answer is None  # visibly cut
    assert extract_answer("4 * 3 = 12 and then", truncated=True).answer is None
    assert extract_answer("So the total is 12.").answer == "12"  # a finished sentence still counts
    assert extract_answer("It is 3/4 of it").answer == "3/4"


def test_second_opinion_rule(monkeypatch):
    # authoritative cases: exact numbers and numeric constants; an answer carrying extra numbers
    assert not second_opinion_applies("\\frac{1}{3}", "0.333333")
    assert not second_opinion_applies("\\frac{1}{2^{99}}", "\\frac{1}{2^{98}}")
    assert not second_opinion_applies("4", "4 \\text{ hours and } 30 \\text{ minutes}")
    assert not second_opinion_applies("4", None)
    # a structural case mathrl's own rules miss and math-verify gets (public: Math-Verify)
    gold, resp = "$p=5,q=2;p=7,q=2$", "$(5,2),(7,2)$"
    assert second_opinion_applies(gold, "(5,2),(7,2)") and math_verify_equal(gold, "(5,2),(7,2)")
    assert grade_local(resp, gold).correct
    monkeypatch.setenv("MATHRL_VERIFIER_SECOND_OPINION", "0")  # negative control: own rules only
    assert not grade_local(resp, gold).correct


def _labelled(name: str, split: str | None = None) -> list[dict]:
    path = SETS / name
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if not r.get("debatable") and (split is None or r.get("split") == split)]


def _score(rows: list[dict]) -> tuple[float, int, int]:
    from mathrl.reward import grade_batch

    grades = grade_batch([r["response"] for r in rows], [r["gold"] for r in rows], timeout=10.0, workers=2,
                         truncated=[r.get("finish_reason") == "length" for r in rows])
    assert not [g for g in grades if g.reason == "timeout"]
    right = sum(g.correct == r["label"] for g, r in zip(grades, rows))
    fp = sum(g.correct and not r["label"] for g, r in zip(grades, rows))
    fn = sum(r["label"] and not g.correct for g, r in zip(grades, rows))
    return right / len(rows), fp, fn


@pytest.mark.slow
def test_accuracy_on_other_graders_suites():
    """Labelled pairs from 12 other graders' public test suites (dev part; debatable labels excluded).
    Measured: 99.7% (0 false positives, 1 false negative out of 294)."""
    acc, fp, fn = _score(_labelled("peers.jsonl", "dev"))
    assert acc >= 0.97 and fp == 0, (acc, fp, fn)


def test_accuracy_on_the_fresh_peer_set():
    """262 pairs from the tests of 10 further projects (inspect_ai, sieval, NeMo-RL, rllm, ...), added after
    the first peer set had been looked at; debatable labels excluded (210 left). Scored untouched: 90.5%
    (2 FP, 18 FN: CAS-style ``sqrt(3)``, ``<answer>`` tags, ``Eq(a, b)``, ``2=x``); after the fixes 98.6%
    (1 FP, 2 FN: two boxes read as one answer, a policy this verifier keeps, and ``\\beginboxed``)."""
    acc, fp, fn = _score(_labelled("peers_fresh.jsonl"))
    assert acc >= 0.97 and fp <= 1, (acc, fp, fn)


def test_accuracy_on_the_untouched_second_fresh_set():
    """94 pairs from the tests of 5 more projects (forge, eval-protocol, SkyThought, ...), 73 without debatable
    labels, scored once when added and not looked at since: 97.3% (0 false positives, 2 false negatives)."""
    acc, fp, fn = _score(_labelled("peers_fresh2.jsonl"))
    assert acc >= 0.97 and fp <= 1, (acc, fp, fn)


def test_real_model_outputs():
    """SmolLM2 samples labelled by reading: on GSM8K and MATH-500 almost all are wrong (false
    positives), on the demo's synthetic task 71 of 192 are right (false negatives). Measured: no false
    positive or negative in 489 (the two rambling MATH-500 responses that ended on the gold without
    stating it were credited until a number that is an inequality's bound stopped counting as an answer)."""
    rows = (_labelled("model_outputs_gsm8k.jsonl") + _labelled("model_outputs_math500.jsonl")
            + _labelled("model_outputs_synthetic.jsonl"))
    acc, fp, fn = _score(rows)
    assert fp <= 0.01 * len(rows) and fn == 0, (acc, fp, fn)


def test_numeric_tolerance_is_off_by_default_and_opt_in():
    """reward.rel_tol: exact rationals by default; with a tolerance, numbers within it count."""
    from mathrl.reward import grade_batch

    golds, resps = ["\\frac{1}{3}", "\\sqrt{2}", "100"], ["0.3333", "1.41421", "100.5"]
    assert [g.correct for g in grade_batch(resps, golds)] == [False, False, False]
    assert [g.correct for g in grade_batch(resps, golds, rel_tol=1e-4)] == [True, True, False]
    assert [g.correct for g in grade_batch(resps, golds, rel_tol=1e-2)] == [True, True, True]
    with pytest.raises(ValueError, match="rel_tol"):
        grade_batch(resps, golds, rel_tol=-1)
