"""The digit-copy task: a prompt ``show : 7`` whose answer is the digit. A tiny model learns it in
seconds, so trainer and ablation tests can check learning, resume and parallelism without the real
model. Its reward is the registered term ``first_digit`` (no verifier), named in a config by
:data:`FIRST_DIGIT`."""

from __future__ import annotations

from mathrl.reward.rewards import RewardContext, register_reward

FIRST_DIGIT = "reward.terms={first_digit: {}}"
"""The config override that trains on :func:`first_digit_reward` instead of the verifier."""


def digit_tokenizer():
    """A 15-token word-level tokenizer (digits, a few words, special tokens) with a minimal chat template:
    only the first line of the last user turn (``show : 7``) is kept, since the instruction lines would
    be ``<unk>`` tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{str(d): 3 + d for d in range(10)}, "show": 13, ":": 14}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = "{{ messages[-1]['content'].split('\\n')[0] }}"
    return tok


def digit_problems(n: int = 64, offset: int = 0):
    """``n`` problems ``show : d`` with gold ``d``, for ``d = (offset + i) % 10``."""
    from mathrl.data import Problem

    return [Problem(id=f"digit/{offset + i}", question=f"show : {(offset + i) % 10}", gold=str((offset + i) % 10),
                    source="digit") for i in range(n)]


@register_reward("first_digit", needs_grades=False)
def first_digit_reward(ctx: RewardContext) -> list[float]:
    """1 when the response starts with the gold digit, else 0 (the digit task's reward; no verifier)."""
    return [1.0 if r.strip()[:1] == g else 0.0 for r, g in zip(ctx.responses, ctx.golds or ())]


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
