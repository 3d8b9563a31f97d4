"""The digit-copy task a tiny model learns in seconds (shared with tests/train: mathrl.testing.digits)."""

from mathrl.testing.digits import (  # noqa: F401
    FIRST_DIGIT, digit_problems, digit_tokenizer, first_digit_grader, first_digit_reward)
