"""The one \\boxed / \\fbox scanner (mathrl.latex) and its three call sites: gold extraction
(mathrl.data.gold.last_boxed), answer extraction from model output (mathrl.reward.extract) and
answer normalisation (mathrl.reward.normalize.clean). Hand-written cases."""

from __future__ import annotations

import time

import pytest

from mathrl.data.gold import last_boxed
from mathrl.latex import Box, find_boxes, last_box, matching_brace, scan_boxes
from mathrl.reward.extract import extract_answer
from mathrl.reward.normalize import clean

# (text, content of the last box) for texts whose last box command is complete
CASES = [
    # nested braces
    ("so $\\boxed{5}$.", "5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("x = \\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"),
    ("\\boxed{a_{b_{c}}}", "a_{b_{c}}"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not count
    ("\\boxed{ 9 }", "9"),
    ("\\boxed {12}", "12"),
    ("\\boxed\n{12}", "12"),
    ("\\boxed{}", ""),
    ("\\left(\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}\\right)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    # a box that is exactly one box; a box holding a box and more
    ("\\boxed{\\boxed{3}}", "3"),
    ("\\boxed{ \\fbox{ 4 } }", "4"),
    ("\\boxed{x = \\boxed{3}}", "x = \\boxed{3}"),
    # \fbox, several boxes: the last one
    ("\\fbox{7}", "7"),
    ("\\boxed{3} and \\fbox{4}", "4"),
    ("\\boxed{1} then later \\boxed{2}", "2"),
    # brace-less forms: a run up to whitespace or $, without trailing . or ,
    ("\\boxed -3/4$", "-3/4"),
    ("$\\boxed -3/4$.", "-3/4"),
    ("The answer is $\\boxed 5$.", "5"),
    ("The answer is \\boxed 42.", "42"),
    ("so \\boxed 1,000, done", "1,000"),
    ("\\boxed \\frac{1}{2}$", "\\frac{1}{2}"),
    ("\\boxed\\pi.", "\\pi"),
    ("{\\boxed 5} more", "5"),
    ("\\(\\boxed 5\\)", "5"),
    ("\\boxed{\\boxed 5.}", "5"),
    # an unclosed box before a complete one: the complete one (inside it) counts
    ("\\boxed{ see \\boxed{3}", "3"),
]

# texts whose last box command is incomplete (unclosed or empty), with the complete boxes before it
UNBALANCED = [
    ("\\boxed{\\frac{1}{2}", []),
    ("\\boxed{1} and then \\boxed{2", ["1"]),
    ("\\boxed{a{b}c} \\boxed{d", ["a{b}c"]),
    ("ends with \\boxed", []),
    ("\\boxed{7} ends with \\boxed $", ["7"]),
    ("\\boxed{7}; we write answers in \\boxed, so", ["7"]),
    ("\\boxed{" * 5, []),
]

NO_BOX = ["", "no box here", "\\boxedx{3}", "\\fboxsep{2}", "boxed{3}", "\\box{3}"]


@pytest.mark.parametrize("text,expected", CASES)
def test_last_box(text, expected):
    assert last_box(text) == expected
    boxes, last_ok = scan_boxes(text)
    assert last_ok and boxes[-1].content == expected
    assert find_boxes(text) == boxes


@pytest.mark.parametrize("text,expected", CASES)
def test_the_three_call_sites_agree(text, expected):
    """Gold extraction, the response extractor and normalisation read the same box."""
    assert last_boxed(text) == expected  # gold (data stage)
    assert find_boxes(text)[-1][2] == expected  # the response extractor's boxes
    ex = extract_answer(text)
    assert ex.source == "boxed"
    if not ex.hedged and expected:
        assert ex.answer == expected
    if last_box(expected) is None:  # (clean strips one box; a content holding a box would lose it too)
        # normalisation strips the same box; several different boxes are one list, as the extractor
        # reads them
        assert clean(text) == clean(ex.answer if ex.hedged else expected)


def test_brace_less_box_takes_the_graders_reading():
    """``\\boxed -3/4$``: TeX would box only ``-``; MATH-style graders read up to ``$``."""
    text = "The answer is $\\boxed -3/4$"
    assert last_boxed(text) == "-3/4"
    assert extract_answer(text).answer == "-3/4"
    assert clean(text) == clean("-3/4")


def test_positions_and_nested_boxes():
    text = "a \\boxed{1} b \\boxed{x^{\\boxed{2}}} c \\fbox 3."
    boxes = find_boxes(text)
    assert [b.content for b in boxes] == ["1", "x^{\\boxed{2}}", "3"]  # the nested box belongs to its box
    assert all(isinstance(b, Box) for b in boxes)
    assert [text[b.start:b.end] for b in boxes] == ["\\boxed{1}", "\\boxed{x^{\\boxed{2}}}", "\\fbox 3."]
    assert matching_brace(text, text.index("{")) == text.index("}")


@pytest.mark.parametrize("text,complete", UNBALANCED)
def test_unbalanced(text, complete):
    boxes, last_ok = scan_boxes(text)
    assert [b.content for b in boxes] == complete and not last_ok
    assert last_box(text) is None
    assert last_boxed(text) is None  # gold: a truncated last box has no stand-in
    # the response extractor ignores the incomplete box and keeps the complete ones before it
    assert [b[2] for b in find_boxes(text)] == complete
    if complete:
        assert extract_answer(text).answer == complete[-1]


@pytest.mark.parametrize("text", NO_BOX)
def test_no_box(text):
    assert scan_boxes(text) == ([], False)
    assert last_box(text) is None and last_boxed(text) is None and find_boxes(text) == []


def test_scanner_is_linear():
    t0 = time.perf_counter()
    assert last_box("\\boxed{" * 60_000) is None
    assert last_box("{" * 200_000 + "\\boxed{1}") == "1"
    assert last_box("\\boxed{" * 2000 + "7" + "}" * 2000) == "7"  # unwrapped 2000 deep
    assert len(find_boxes(" ".join(f"\\boxed{{{i}}}" for i in range(50_000)))) == 50_000
    assert last_box("\\boxed " + "1" * 1_000_000 + "$") == "1" * 1_000_000
    assert time.perf_counter() - t0 < 5.0
