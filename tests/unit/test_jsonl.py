"""mathrl/jsonl.py: a user's JSON-lines file, every error naming the file and the line."""

from __future__ import annotations

import pytest

from mathrl.jsonl import json_objects


class Bad(ValueError):
    pass


def test_objects_with_their_line_numbers_blank_lines_skipped(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n  \n{"b": [2]}\n', encoding="utf-8")
    assert list(json_objects(p, Bad)) == [(1, {"a": 1}), (4, {"b": [2]})]


@pytest.mark.parametrize("text, message", [
    ('{"a": 1}\n{"a": \n', r"a.jsonl:2: not valid JSON \(Expecting value at column \d+\)"),
    ('{"a": 1}\n[1, 2]\n', r"a.jsonl:2: expected a JSON object, got list"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, text, message):
    p = tmp_path / "a.jsonl"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(Bad, match=message):
        list(json_objects(p, Bad))


def test_a_missing_file_says_so_with_the_hint(tmp_path):
    with pytest.raises(Bad, match=r"none.jsonl: no such file \(make one\)"):
        list(json_objects(tmp_path / "none.jsonl", Bad, missing="make one"))
