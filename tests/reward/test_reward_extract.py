"""Final-answer extraction policy."""

from __future__ import annotations

import pytest

from mathrl.latex import find_boxes
from mathrl.reward.extract import extract_answer


@pytest.mark.parametrize(
    "text,answer,source",
    [
        ("so \\boxed{\\frac{1}{\\sqrt{2}}} done", "\\frac{1}{\\sqrt{2}}", "boxed"),
        ("\\boxed{1} then\n\n\\boxed{\\{1,2\\}}", "\\{1,2\\}", "boxed"),
        ("\\fbox{7}", "7", "boxed"),
        ("\\boxed 5.", "5", "boxed"),
        ("a\n#### 1,200\n", "1,200", "hash"),
        ("The final answer is $3.5$. Thanks", "3.5", "phrase"),
        ("Final Answer: 12", "12", "phrase"),
        ("the answer is\n\n$$x^2$$", "x^2", "phrase"),
        ("The answer is 2.5. It took 2 hours.", "2.5", "phrase"),
        ("Some work.\n\n**42**", "42", "bold"),
        ("Some work.\n\n**Answer: $42$**", "42", "phrase"),
        ("The total is \\(12\\).", "12", "math"),
        ("we get\n\\[ 4 \\cdot 3 = 12 \\]", "4 \\cdot 3 = 12", "math"),
        ("so it is $\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}$", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "math"),
        ("She has 1,234 eggs.", "1,234", "last_number"),
        ("It is 3/4 of it", "3/4", "last_number"),
        ("nothing here", None, "none"),
    ],
)
def test_markers(text, answer, source):
    ex = extract_answer(text)
    assert ex.answer == answer and ex.source == source


def test_truncated_policy():
    # last number / bold / math spans are not credited when the sampler cut the response
    assert extract_answer("4 * 3 = 12 and then", truncated=True).answer is None
    assert extract_answer("work\n\n**12**", truncated=True).answer is None
    # explicit markers still count
    assert extract_answer("so \\boxed{12}. Let me check 4+4+4 = 12, wh", truncated=True).answer == "12"
    assert extract_answer("The answer is 12. But", truncated=True).answer == "12"
    # a box cut open is ignored
    assert extract_answer("so \\boxed{1", truncated=True).answer is None


def test_hedging_and_self_correction():
    h = extract_answer("either \\boxed{3} or \\boxed{4}")
    assert h.hedged and h.answer == "3, 4"
    same = extract_answer("\\boxed{3} and again \\boxed{3}")
    assert not same.hedged and same.answer == "3"
    corr = extract_answer("\\boxed{3}\n\nNo, recomputing: \\boxed{4}")
    assert not corr.hedged and corr.answer == "4"


def test_find_boxed_nested_and_unclosed():
    assert [b[2] for b in find_boxes("\\boxed{a{b}c} \\boxed{d")] == ["a{b}c"]


def test_huge_response_is_fast():
    import time

    text = ("word 123 $x$ **b** " * 50000) + "\\boxed{7}"
    t = time.perf_counter()
    assert extract_answer(text).answer == "7"
    assert time.perf_counter() - t < 2.0


@pytest.mark.parametrize("text", ["answer: ," * 50000, "the answer is " * 30000, "\\boxed{" * 60000, "\\[" * 100000 + "1", "\\(" * 100000 + "\\)", "{" * 200000 + "\\boxed{1}"])
def test_adversarial_responses_are_linear(text):
    import time

    t = time.perf_counter()
    extract_answer(text)
    extract_answer(text, truncated=True)
    assert time.perf_counter() - t < 2.0
