"""Prompt templates, with SmolLM2's real tokenizer (its ChatML chat template) where installed."""

from __future__ import annotations

import pytest

from mathrl.data import DataError, Problem, get_template, render_prompt
from mathrl.data.templates import BOXED_INSTRUCTION, FEWSHOT_EXAMPLES, ONESHOT_EXAMPLE, TEMPLATES

P = Problem(id="t/0", question="What is 2 + 3?", gold="5", source="t")


@pytest.mark.slow
def test_chat_boxed_with_real_tokenizer(smollm2_tokenizer) -> None:
    text = render_prompt(P, smollm2_tokenizer, "chat_boxed")
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        f"<|im_start|>user\nWhat is 2 + 3?\n\n{BOXED_INSTRUCTION}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert "\\boxed{}" in text


def test_system_prompt_and_oneshot(smollm2_tokenizer) -> None:
    t = get_template("chat_boxed_oneshot", system="You are a careful math tutor.")
    text = t.render(P, smollm2_tokenizer)
    assert text.startswith("<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n")
    assert "SmolLM" not in text  # the default system prompt is replaced
    q, a = ONESHOT_EXAMPLE
    assert f"<|im_start|>user\n{q}\n\n{BOXED_INSTRUCTION}<|im_end|>" in text
    assert f"<|im_start|>assistant\n{a}<|im_end|>" in text
    assert a.rstrip().endswith("\\boxed{16}")
    assert text.index(a) < text.index("What is 2 + 3?")
    assert text.endswith("<|im_start|>assistant\n")
    ids = smollm2_tokenizer(text)["input_ids"]
    assert smollm2_tokenizer.decode(ids) == text  # round-trips through the real tokenizer


def test_messages_structure() -> None:
    msgs = get_template("chat_boxed_oneshot").messages(P)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[-1]["content"] == f"What is 2 + 3?\n\n{BOXED_INSTRUCTION}"
    msgs = get_template("chat_boxed", system="S", instruction="Answer in \\boxed{}.").messages("Q?")
    assert msgs == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?\n\nAnswer in \\boxed{}."}]


def test_fewshot_plain() -> None:
    t = TEMPLATES["fewshot_plain"]
    text = t.render(P)
    assert text.endswith("Question: What is 2 + 3?\nAnswer:")
    assert text.count("Question:") == len(FEWSHOT_EXAMPLES) + 1
    for q, a in FEWSHOT_EXAMPLES:
        assert f"Question: {q}\nAnswer: {a}" in text
        assert "\\boxed{" in a
    assert "\n\nQuestion:" in t.stop
    zero = get_template("fewshot_plain", examples=[], instruction="")
    assert zero.render(P) == "Question: What is 2 + 3?\nAnswer:"


def test_template_errors() -> None:
    with pytest.raises(DataError, match="unknown prompt template 'chat'; known: chat_boxed"):
        get_template("chat")
    with pytest.raises(DataError, match="needs the model's tokenizer"):
        render_prompt(P, None, "chat_boxed")
    with pytest.raises(DataError, match="takes no system prompt"):
        get_template("fewshot_plain", system="S")

    class NoTemplate:
        chat_template = None

        def apply_chat_template(self, *a, **k):  # pragma: no cover - must not be reached
            raise AssertionError

    with pytest.raises(DataError, match="no chat template .* use 'fewshot_plain'"):
        render_prompt(P, NoTemplate(), "chat_boxed")
