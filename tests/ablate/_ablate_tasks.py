"""A digit-copy task a tiny model learns in seconds (same pattern as tests/train/_train_tasks.py)."""

from __future__ import annotations


def digit_tokenizer():
    """A 15-token word-level tokenizer (digits, a few words, special tokens) with a minimal chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{str(d): 3 + d for d in range(10)}, "show": 13, ":": 14}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = "{{ messages[-1]['content'].split('\\n')[0] }}"
    return tok


def digit_problems(n: int = 64, offset: int = 0):
    from mathrl.data import Problem

    return [Problem(id=f"digit/{offset + i}", question=f"show : {(offset + i) % 10}", gold=str((offset + i) % 10),
                    source="digit") for i in range(n)]


def first_digit_reward(responses, golds, truncated):
    """1 when the response starts with the gold digit (one-token responses are always 'truncated')."""
    return [1.0 if r.strip()[:1] == g else 0.0 for r, g in zip(responses, golds)]


def first_digit_grader(responses, golds, truncated):
    """The evaluation counterpart of :func:`first_digit_reward`, as verifier Grades."""
    from mathrl.reward.grader import Grade

    out = []
    for r, g in zip(responses, golds):
        ans = r.strip()[:1]
        if not ans.isdigit():
            out.append(Grade(False, None, "no_answer"))
        else:
            out.append(Grade(ans == g, ans, "ok" if ans == g else "mismatch"))
    return out
