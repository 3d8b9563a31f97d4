"""Prompt templates: turn a :class:`Problem` into the text a model is given.

Chat models get their own chat template (``tokenizer.apply_chat_template``)
with an instruction to put the final answer in ``\\boxed{}``, optionally a
system prompt and a one-shot exchange that shows the format. Base models get a
plain few-shot text (``Question: ... Answer: ...``) that ends where the model
continues; its :attr:`PromptTemplate.stop` strings end the answer.

Registry (:data:`mathrl.registry.TEMPLATES`, filled here; :func:`get_template`): one
chat template without and one with a worked example, and one plain few-shot template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mathrl.data.errors import DataError
from mathrl.data.problem import Problem
from mathrl.registry import TEMPLATES

BOXED_INSTRUCTION = "Solve the problem step by step. Put the final answer in \\boxed{}."

# A short worked exchange that shows the expected format (written for this project).
ONESHOT_EXAMPLE: tuple[str, str] = (
    "A baker has 12 muffins and bakes 9 more. Then she sells 5 of them. How many muffins does she have left?",
    "She has 12 + 9 = 21 muffins after baking. After selling 5 she has 21 - 5 = 16.\n\\boxed{16}",
)

# Few-shot examples for base models (written for this project): short reasoning, boxed answer.
FEWSHOT_EXAMPLES: tuple[tuple[str, str], ...] = (
    ONESHOT_EXAMPLE,
    (
        "Tom reads 15 pages a day. How many pages does he read in 4 days?",
        "He reads 15 pages each day for 4 days, so 15 * 4 = 60 pages. The answer is \\boxed{60}.",
    ),
    (
        "What is the value of $x$ if $3x + 4 = 19$?",
        "Subtract 4 from both sides: $3x = 15$, so $x = 5$. The answer is \\boxed{5}.",
    ),
    (
        "A rope 42 meters long is cut into 6 equal pieces. How long is each piece?",
        "Each piece is 42 / 6 = 7 meters long. The answer is \\boxed{7}.",
    ),
)


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the chat templates use."""

    chat_template: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class PromptTemplate:
    """How to render a problem.

    Attributes:
        name: registry name.
        chat: whether ``render`` needs a tokenizer with a chat template.
        instruction: appended to the question in the user turn (chat) or
            shown once at the top (plain); ``""`` for none.
        system: system prompt for chat templates; ``None`` keeps the
            tokenizer's default (SmolLM2's template inserts its own).
        examples: (question, worked answer) exchanges shown before the problem.
        stop: strings that end the model's answer (for plain few-shot prompts,
            where the model would otherwise write the next "Question:").
    """

    name: str
    chat: bool
    instruction: str = BOXED_INSTRUCTION
    system: str | None = None
    examples: tuple[tuple[str, str], ...] = ()
    stop: tuple[str, ...] = field(default_factory=tuple)

    def user_text(self, question: str) -> str:
        """The user turn for ``question``: the question, a blank line, the instruction."""
        question = question.strip()
        return f"{question}\n\n{self.instruction}" if self.instruction else question

    def messages(self, problem: Problem | str) -> list[dict[str, str]]:
        """Chat messages (system?, example user/assistant pairs, the problem)."""
        question = problem.question if isinstance(problem, Problem) else problem
        msgs: list[dict[str, str]] = []
        if self.system is not None:
            msgs.append({"role": "system", "content": self.system})
        for q, a in self.examples:
            msgs.append({"role": "user", "content": self.user_text(q)})
            msgs.append({"role": "assistant", "content": a})
        msgs.append({"role": "user", "content": self.user_text(question)})
        return msgs

    def render(self, problem: Problem | str, tokenizer: ChatTokenizer | None = None) -> str:
        """The prompt text for ``problem``.

        Chat templates call ``tokenizer.apply_chat_template(messages,
        tokenize=False, add_generation_prompt=True)``, so the text ends with the
        assistant header and the model writes the answer next.

        Raises:
            DataError: a chat template without a tokenizer, or a tokenizer
                without a chat template.
        """
        if not self.chat:
            return self._render_plain(problem.question if isinstance(problem, Problem) else problem)
        if tokenizer is None:
            raise DataError(f"prompt template '{self.name}' needs the model's tokenizer (it uses its chat template)")
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(
                f"prompt template '{self.name}': the tokenizer has no chat template (a base model?); "
                f"use 'fewshot_plain' instead"
            )
        text = tokenizer.apply_chat_template(self.messages(problem), tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):  # pragma: no cover - transformers returns str for tokenize=False
            raise DataError(f"prompt template '{self.name}': apply_chat_template returned {type(text).__name__}")
        return text

    def render_batch(self, problems: Sequence[Problem], tokenizer: ChatTokenizer | None = None) -> list[str]:
        """``render`` for each problem."""
        return [self.render(p, tokenizer) for p in problems]

    def _render_plain(self, question: str) -> str:
        blocks: list[str] = []
        if self.instruction:
            blocks.append(self.instruction)
        for q, a in self.examples:
            blocks.append(f"Question: {q.strip()}\nAnswer: {a.strip()}")
        blocks.append(f"Question: {question.strip()}\nAnswer:")
        return "\n\n".join(blocks)


for _template, _doc in (
    (PromptTemplate(name="chat_boxed", chat=True), "chat template, answer in \\boxed{}"),
    (PromptTemplate(name="chat_boxed_oneshot", chat=True, examples=(ONESHOT_EXAMPLE,)),
     "chat template with one worked example (helps small models use \\boxed{})"),
    (PromptTemplate(
        name="fewshot_plain",
        chat=False,
        instruction="Solve each problem. End with the final answer in \\boxed{}.",
        examples=FEWSHOT_EXAMPLES,
        stop=("\n\nQuestion:", "\nQuestion:"),
    ), "plain few-shot text (Question: ... Answer:) for base models"),
):
    TEMPLATES.register(_template.name, _template, doc=_doc)


def get_template(
    name: str,
    *,
    system: str | None = None,
    instruction: str | None = None,
    examples: Sequence[tuple[str, str]] | None = None,
) -> PromptTemplate:
    """The registered template ``name``, with optional overrides.

    Args:
        name: one of :data:`TEMPLATES`.
        system: a system prompt (chat templates only).
        instruction: replaces the default instruction.
        examples: replaces the worked examples (e.g. ``[]`` for zero-shot plain).

    Raises:
        DataError: unknown name, or a system prompt for a plain template.
    """
    base = TEMPLATES.get(name, None)
    if base is None:
        raise DataError(f"unknown prompt template '{name}'; known: {', '.join(sorted(TEMPLATES))}")
    changes: dict[str, Any] = {}
    if system is not None:
        if not base.chat:
            raise DataError(f"prompt template '{name}' is plain text (no chat roles); it takes no system prompt")
        changes["system"] = system
    if instruction is not None:
        changes["instruction"] = instruction
    if examples is not None:
        changes["examples"] = tuple((str(q), str(a)) for q, a in examples)
    if not changes:
        return base
    return PromptTemplate(**{**base.__dict__, **changes})


def render_prompt(problem: Problem | str, tokenizer: ChatTokenizer | None = None, template: str = "chat_boxed") -> str:
    """Shortcut: ``get_template(template).render(problem, tokenizer)``."""
    return get_template(template).render(problem, tokenizer)
