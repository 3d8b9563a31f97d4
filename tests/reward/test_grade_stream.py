"""Grading while the engine generates (``GradeStream``, reward.stream): the verdicts are grade_batch's
on real model outputs whatever order and whatever subset arrive early, rows that arrived with another
text are graded again, and the grading happens in the background before ``finish``."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from mathrl.reward import grade_batch
from mathrl.reward.api import GradeStream

SETS = Path(__file__).parents[2] / "eval" / "verifier_sets"


def _model_outputs():
    rows = [json.loads(line) for line in (SETS / "model_outputs_math500.jsonl").read_text().splitlines() if line]
    rows += [json.loads(line) for line in (SETS / "model_outputs_gsm8k.jsonl").read_text().splitlines() if line]
    return [r["response"] for r in rows], [r["gold"] for r in rows]


@pytest.mark.slow
def test_stream_gives_grade_batch_verdicts_on_real_outputs():
    responses, golds = _model_outputs()
    n = len(responses)
    truncated = [i % 7 == 0 for i in range(n)]
    want = grade_batch(responses, golds, truncated=truncated, workers=2)
    never = set(range(0, n, 10))                      # rows the engine never streamed
    stale = set(range(3, n, 9)) - never               # rows streamed with a text that is not the final one
    wrong_text = {i: responses[i] + " So the answer is 4127." for i in stale}
    # precondition: the stale texts grade differently on some rows, so trusting them would be caught
    stale_grades = grade_batch([wrong_text[i] for i in sorted(stale)], [golds[i] for i in sorted(stale)],
                               truncated=[truncated[i] for i in sorted(stale)], workers=2)
    assert sum(g != want[i] for g, i in zip(stale_grades, sorted(stale))) >= 5

    st = GradeStream(golds, workers=2)
    order = [i for i in range(n) if i not in never]
    random.Random(0).shuffle(order)
    for i in order:
        st.put(i, wrong_text.get(i, responses[i]), truncated[i])
    deadline = time.monotonic() + 300  # graded in the background, before finish() is called
    while len(st._got) < len(order) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(st._got) == len(order)
    got = st.finish(responses, truncated)
    assert got == want
    assert st.streamed == n - len(never) - len(stale)


def test_stream_with_nothing_streamed_and_bad_rows():
    """An engine that streams nothing still gets every row graded; out-of-range rows are ignored; a
    truncated flag that changed counts as another text."""
    st = GradeStream(["4", "x+1"], workers=1)
    st.put(7, "42", False)
    st.put(1, "\\boxed{x+1}", True)
    got = st.finish(["\\boxed{4}", "\\boxed{x+1}"], [False, False])
    assert [g.correct for g in got] == [True, True] and st.streamed == 0
