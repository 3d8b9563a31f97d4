"""Small LaTeX text helpers shared by the data stage (gold extraction) and the verifier."""

from __future__ import annotations


def matching_brace(text: str, open_pos: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``text[open_pos]``, or -1 when it is never closed.

    A backslash escapes the next character, so ``\\{``, ``\\}`` (literal braces in LaTeX) and
    ``\\\\`` do not change the depth. Linear in the length scanned.
    """
    depth = 0
    i = open_pos
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1
