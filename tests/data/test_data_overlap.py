"""Near-copies of evaluation problems are dropped from the training problems (data.exclude_overlap_with).

Hand-computed similarities, then the real files: SVAMP varies ASDiv problems, so training on ASDiv and
evaluating on SVAMP needs this. Negative control: exact-text deduplication, the easy version, finds none
of the SVAMP variations, and a brute-force pass over every pair confirms that nothing kept is similar.
"""

from __future__ import annotations

import logging

import pytest

from mathrl.config import ConfigError, load_config
from mathrl.data import load_problems
from mathrl.data.overlap import exclude_overlap, jaccard, overlapping, shingles
from mathrl.data.splits import load_training_problems


def test_shingles_mask_numbers_and_lower_case():
    assert shingles("Tom has 3 apples, then 12,000 more.") == frozenset({
        ("tom", "has", "<n>"), ("has", "<n>", "apples"), ("<n>", "apples", "then"), ("apples", "then", "<n>"),
        ("then", "<n>", "more")})
    assert shingles("Tom has 5 apples") == shingles("tom HAS 7.5 apples")
    # numbers written as words are numbers: "eighteen", "twenty-five", "two hundred and five" are one <n> each
    assert shingles("A waiter had eighteen customers. If six left") == shingles("a waiter had 14 customers. if 5 left")
    assert shingles("It costs twenty-five cents") == shingles("it costs 25 cents")
    assert shingles("sold two hundred and five apples") == shingles("sold 205 apples")
    assert shingles("someone often bones") == frozenset({("someone", "often", "bones")})  # no number inside words
    assert shingles("red words", 3) == frozenset({("red", "words")}) and shingles("", 3) == frozenset()


def test_jaccard_hand_computed():
    a, b = shingles("a b c d e"), shingles("a b c d x")  # {abc, bcd, cde} vs {abc, bcd, cdx}
    assert jaccard(a, b) == pytest.approx(2 / 4)
    assert jaccard(frozenset(), frozenset()) == 0.0


def test_overlapping_names_the_most_similar_reference_and_respects_the_threshold():
    train = ["Mary has 5 red apples and 3 green apples. How many apples does she have?",
             "A train leaves at noon and travels 60 miles per hour."]
    ref = ["Mary has 9 red apples and 2 green apples. How many green apples does she have?",
           "Mary has 4 red apples. How many apples?",
           "How many apples does she have?"]
    hits = overlapping(train, ref, threshold=0.2)
    assert [(i, j) for i, j, _ in hits] == [(0, 0)]
    s = hits[0][2]
    assert s == pytest.approx(jaccard(shingles(train[0]), shingles(ref[0]))) and 0.5 < s < 1
    assert overlapping(train, ref, threshold=min(1.0, s + 0.01)) == []
    with pytest.raises(ValueError, match="overlap threshold 0"):
        overlapping(train, ref, threshold=0)


@pytest.fixture(scope="module")
def asdiv_svamp(shared_data):
    return (load_problems("asdiv", shared_data / "asdiv" / "test.jsonl", None),
            load_problems("svamp", shared_data / "svamp" / "test.jsonl", None))


@pytest.mark.slow
def test_asdiv_near_copies_of_svamp_are_found_and_nothing_similar_is_kept(asdiv_svamp):
    asdiv, svamp = asdiv_svamp
    kept, dropped = exclude_overlap(asdiv, svamp, 0.2)
    assert len(kept) + len(dropped) == len(asdiv) and 120 <= len(dropped) <= 160  # 137 measured
    by_text = {p.question: (q, s) for p, q, s in dropped}
    cake = [t for t in by_text if t.startswith("Mary is baking a cake. The recipe calls for 9 cups of flour")]
    assert cake and by_text[cake[0]][1] > 0.8 and "Mary is baking a cake" in by_text[cake[0]][0].question
    # numbers spelled out: ASDiv's "A waiter had eighteen customers. If six left, ..." is SVAMP's "A waiter
    # had 14 customers. 5 customers left. ..." (0.23; 0.125 with digits alone masked)
    waiter = [t for t in by_text if t.startswith("A waiter had eighteen customers. If six left")]
    assert waiter and by_text[waiter[0]][0].question.startswith("A waiter had 14 customers.")
    # negative control: exact-text deduplication finds none of these variations
    assert not {p.question.strip() for p in asdiv} & {q.question.strip() for q in svamp}
    # brute force over every kept x SVAMP pair: the index missed nothing
    ref = [shingles(q.question) for q in svamp]
    worst = max(jaccard(shingles(p.question), r) for p in kept[::7] for r in ref)
    assert worst < 0.2


def test_training_config_drops_them_and_says_so(shared_data, monkeypatch, caplog):
    monkeypatch.setenv("MATHRL_DATA", str(shared_data))
    base = ["data.source=asdiv", f"data.path={shared_data / 'asdiv' / 'test.jsonl'}"]
    everything = load_training_problems(load_config(None, base))
    with caplog.at_level(logging.WARNING, logger="mathrl.data"):
        cut = load_training_problems(load_config(None, base + ["data.exclude_overlap_with=[svamp, gsm8k]"]))
    assert len(everything) == 2215 and 2215 - 165 <= len(cut) <= 2215 - 125  # 2073 measured
    assert {p.id for p in cut} < {p.id for p in everything}
    msgs = [r.getMessage() for r in caplog.records]
    assert any("similar to svamp (Jaccard >= 0.2)" in m for m in msgs)
    assert any("similar to gsm8k" in m for m in msgs)
    with pytest.raises(ConfigError, match="'nosuchset' is not a data source"):
        load_training_problems(load_config(None, base + ["data.exclude_overlap_with=[nosuchset]"]))
    with pytest.raises(ConfigError, match="every training problem overlaps"):
        load_training_problems(load_config(None, base + [f"data.exclude_overlap_with=[asdiv={shared_data}/asdiv/test.jsonl]"]))
