"""Gold extraction: \\boxed{} parsing, GSM8K '####', number canonicalisation, ASDiv units."""

from __future__ import annotations

import pytest

from mathrl.data.gold import format_number, gold_kind, gsm8k_gold, last_boxed, strip_unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is $\\boxed{5}$.", "5"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("x = \\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{1} then later \\boxed{2}", "2"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not count
        ("\\boxed{a_{b_{c}}}", "a_{b_{c}}"),  # three levels of nesting
        ("\\fbox{7}", "7"),
        ("\\boxed{3} and \\fbox{4}", "4"),  # the last of either command
        ("The answer is $\\boxed 5$.", "5"),
        ("The answer is \\boxed 42.", "42"),
        ("\\boxed {12}", "12"),
        ("\\boxed{ 9 }", "9"),
        ("\\boxed{}", ""),
        ("\\left(\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}\\right)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ],
)
def test_last_boxed(text: str, expected: str) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "no box here",
        "\\boxed{\\frac{1}{2}",  # truncated: the last box is not closed
        "\\boxed{1} and then \\boxed{2",  # an earlier complete box is not a stand-in
        "\\boxedx{3}",  # another command
        "ends with \\boxed",
    ],
)
def test_last_boxed_none(text: str) -> None:
    assert last_boxed(text) is None


def test_gsm8k_gold() -> None:
    assert gsm8k_gold("She makes 9 * 2 = $18.\n#### 18") == "18"
    assert gsm8k_gold("...\n#### 1,200") == "1200"
    assert gsm8k_gold("#### -3") == "-3"
    assert gsm8k_gold("a #### 5 then #### 6") == "6"
    with pytest.raises(ValueError, match="no '####'"):
        gsm8k_gold("The answer is 5")
    with pytest.raises(ValueError, match="nothing after"):
        gsm8k_gold("work...\n####   ")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(27.0, "27"), (-1.0, "-1"), (2.5, "2.5"), (0.1, "0.1"), (7, "7"), ("025", "25"), ("1,200", "1200"),
     (" 12 ", "12"), ("\\frac{1}{2}", "\\frac{1}{2}"), ("1.50", "1.50")],
)
def test_format_number(value, expected: str) -> None:
    assert format_number(value) == expected


def test_format_number_rejects() -> None:
    with pytest.raises(ValueError):
        format_number(float("nan"))
    with pytest.raises(ValueError):
        format_number(True)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("9 (apples)", ("9", "apples")), ("3:30 p.m.", ("3:30 p.m.", None)), ("-(1/3)", ("-(1/3)", None)),
     ("0.46 (dollars)", ("0.46", "dollars")), ("5/2", ("5/2", None)), ("12 ", ("12", None))],
)
def test_strip_unit(answer: str, expected) -> None:
    assert strip_unit(answer) == expected


@pytest.mark.parametrize(
    ("gold", "kind"),
    [("12", "integer"), ("-3", "integer"), ("1,200", "integer"), ("0.5", "decimal"), ("4.5e33", "decimal"),
     ("5/2", "fraction"), ("3:30 p.m.", "ratio_or_time"), ("5:6", "ratio_or_time"),
     ("\\frac{1}{2}", "expression"), ("x^2+1", "expression"), ("Yes", "text"), ("February 3rd", "text")],
)
def test_gold_kind(gold: str, kind: str) -> None:
    assert gold_kind(gold) == kind


# ----------------------------------------------------------------------------- property: any balanced content

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_atoms = st.sampled_from(["x", "1", "+", " ", "\\frac", "\\{", "\\}", "^", "_", "\\\\", ",", "$"])
_balanced = st.recursive(
    st.lists(_atoms, max_size=4).map("".join),
    lambda inner: st.tuples(inner, inner, inner).map(lambda t: f"{t[0]}{{{t[1]}}}{t[2]}"),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(content=_balanced, before=st.text(alphabet="ab \n", max_size=10), after=st.text(alphabet="ab .\n", max_size=10))
def test_last_boxed_returns_any_balanced_content(content: str, before: str, after: str) -> None:
    text = f"{before}\\boxed{{1}} then {before}\\boxed{{{content}}}{after}"
    assert last_boxed(text) == content.strip()
