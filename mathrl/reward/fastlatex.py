"""A direct LaTeX-to-sympy reader for the common answer subset, before latex2sympy's ANTLR parser.

latex2sympy2_extended (the parser math-verify uses) spends most of the verifier's time in ANTLR's
adaptive prediction: 78% of :func:`mathrl.reward.grader.grade_local` on the peers' suites. Most
answers that reach :func:`mathrl.reward.symbolic.to_sympy` are small expressions (``3\\sqrt{2}``,
``\\frac{x+1}{x-1}``, ``2x^2+7x-4``, ``(3*sqrt(5))/7``), which this recursive-descent reader turns
into the same sympy value directly. Anything outside the subset returns ``None`` and goes to
latex2sympy, so the reader only has to be right on what it accepts:

* integers; single letters as symbols, lowercased as latex2sympy does, with ``e``/``E`` Euler's
  number and ``i``/``I`` the imaginary unit (as :func:`~mathrl.reward.symbolic.to_sympy` maps them);
  ``\\pi``;
* ``+ - * / \\cdot \\times``; implicit products; ``a/b c`` is ``a/(b c)`` (latex2sympy's reading);
* ``^`` with a braced exponent or a single digit or letter; one ``^`` per power (a chain is refused
  by the guard before);
* ``( )``, ``\\left( \\right)`` and ``{ }`` groups; ``\\frac``, ``\\dfrac``, ``\\tfrac`` (braced or
  one-character arguments, ``\\frac58``); ``\\sqrt{x}``, ``\\sqrt[n]{x}``; ``\\sin``, ``\\cos``,
  ``\\tan``, ``\\ln`` applied to a parenthesised argument.

Refused (left to latex2sympy, whose reading differs from the plain one and is kept): an implicit
product of two numeric factors where the right one is a number, fraction or group (``2(3)``,
``2\\frac58``, ``1\\frac{1}{2}x``: latex2sympy reads mixed numbers and sums there), a letter before
``(`` (a function application, ``x(3)``), ``d`` before a letter (a differential), a sign after an operator, division by a literal zero,
subscripts, relations, commas, and any other command. ``tests/reward/test_fastlatex.py`` checks
the reader against latex2sympy on every answer of the project's and the peers' labelled sets.
"""

from __future__ import annotations

__all__ = ["fast_parse"]

_FRACS = ("\\frac", "\\dfrac", "\\tfrac")
_FUNCS = {"\\sin": "sin", "\\cos": "cos", "\\tan": "tan", "\\ln": "log"}
_MUL_OPS = ("*", "\\cdot", "\\times")


class _Refuse(Exception):
    """The text is outside the subset: latex2sympy reads it."""


def divide(a, b):
    """``a / b`` (a module-level step so that the tests can check a wrong reader is caught)."""
    return a / b


class _Reader:
    def __init__(self, text: str):
        import sympy

        self.sp = sympy
        self.s = text
        self.i = 0

    # -- scanning ------------------------------------------------------------------------------
    def _skip(self) -> None:
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1

    def peek(self) -> str:
        """The next token without consuming it: a command (``\\frac``), a digit run, or one char."""
        self._skip()
        if self.i >= len(self.s):
            return ""
        c = self.s[self.i]
        if c == "\\":
            j = self.i + 1
            while j < len(self.s) and self.s[j].isalpha():
                j += 1
            if j == self.i + 1:
                raise _Refuse  # \, \! \{ ...
            return self.s[self.i:j]
        if c.isdigit():
            j = self.i
            while j < len(self.s) and self.s[j].isdigit():
                j += 1
            return self.s[self.i:j]
        return c

    def take(self, tok: str | None = None) -> str:
        t = self.peek()
        if tok is not None and t != tok:
            raise _Refuse
        self.i += len(t)
        return t

    def take_char(self) -> str:
        """One character (a one-character ``\\frac`` or ``^`` argument: ``\\frac58``, ``x^23``)."""
        self._skip()
        if self.i >= len(self.s):
            raise _Refuse
        c = self.s[self.i]
        self.i += 1
        return c

    # -- grammar -------------------------------------------------------------------------------
    def expr(self, close: str):
        sign = 1
        if self.peek() in ("+", "-"):
            sign = -1 if self.take() == "-" else 1
        total = sign * self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            if self.peek() in ("+", "-", ""):
                raise _Refuse
            t = self.term()
            total = total + t if op == "+" else total - t
        if self.peek() != close:
            raise _Refuse
        return total

    def term(self):
        value = self.chain()
        while True:
            op = self.peek()
            if op in _MUL_OPS:
                self.take()
                value = value * self.chain()
            elif op == "/":
                self.take()
                d = self.chain()
                if d.is_zero:
                    raise _Refuse
                value = divide(value, d)
            else:
                return value

    def chain(self):
        """Factors written side by side (an implicit product)."""
        if self.peek() in ("+", "-", "*", "/", "^", "", ")", "}"):
            raise _Refuse
        value, numeric = self.power()
        while self.peek() not in ("+", "-", "*", "/", "\\cdot", "\\times", ")", "}", "]", "\\right", ""):
            nxt = self.peek()
            mixed_risk = nxt[0].isdigit() or nxt in _FRACS or nxt in ("{", "(", "\\left")
            f, f_numeric = self.power()
            if numeric and mixed_risk and f_numeric:
                raise _Refuse  # 2(3), 2\frac58, 2{\frac12}: latex2sympy reads these its own way
            value, numeric = value * f, numeric and f_numeric
        return value

    def power(self):
        base, numeric = self.atom()
        if self.peek() == "^":
            self.take()
            exp, e_numeric = self.exponent()
            if self.peek() == "^":
                raise _Refuse
            base, numeric = self.sp.Pow(base, exp), numeric and e_numeric
        return base, numeric

    def exponent(self):
        t = self.peek()
        if t == "{":
            return self.group("{", "}")
        c = self.take_char()
        if c.isdigit():
            if self.i < len(self.s) and self.s[self.i].isdigit():
                raise _Refuse  # x^23
            return self.sp.Integer(int(c)), True
        if c.isalpha():
            return self.letter(c), False
        raise _Refuse

    def group(self, open_: str, close: str):
        self.take(open_)
        v = self.expr(close)
        self.take(close)
        return v, not v.free_symbols

    def arg(self):
        """A ``\\frac``/``\\sqrt`` argument: a braced group or one character."""
        if self.peek() == "{":
            return self.group("{", "}")[0]
        c = self.take_char()
        if c.isdigit():
            return self.sp.Integer(int(c))
        if c.isalpha():
            return self.letter(c)
        raise _Refuse

    def letter(self, c: str):
        c = c.lower()
        if c == "e":
            return self.sp.E
        if c == "i":
            return self.sp.I
        return self.sp.Symbol(c)

    def atom(self):
        sp = self.sp
        t = self.peek()
        if t[:1].isdigit():
            self.take()
            return sp.Integer(int(t)), True
        if len(t) == 1 and t.isalpha():
            self.take()
            if self.peek() == "(":
                raise _Refuse  # x(3): latex2sympy applies a function
            if t == "d" and self.peek()[:1].isalpha():
                raise _Refuse  # dx: latex2sympy reads a differential
            return self.letter(t), False
        if t == "(":
            v, _ = self.group("(", ")")
            return v, not v.free_symbols
        if t == "{":
            v, _ = self.group("{", "}")
            return v, not v.free_symbols
        if t == "\\left":
            self.take()
            self.take("(")
            v = self.expr("\\right")
            self.take("\\right")
            self.take(")")
            return v, not v.free_symbols
        if t == "\\pi":
            self.take()
            return sp.pi, True
        if t in _FRACS:
            self.take()
            num = self.arg()
            den = self.arg()
            if den.is_zero:
                raise _Refuse
            v = divide(num, den)
            return v, not v.free_symbols
        if t == "\\sqrt":
            self.take()
            if self.peek() == "[":
                self.take("[")
                n = self.expr("]")
                self.take("]")
                if n.is_zero:
                    raise _Refuse
                v = sp.Pow(self.arg(), 1 / n if not n.is_Integer else sp.Rational(1, int(n)))
            else:
                v = sp.sqrt(self.arg())
            return v, not v.free_symbols
        if t in _FUNCS:
            self.take()
            if self.peek() == "\\left":
                self.take()
                self.take("(")
                inner = self.expr("\\right")
                self.take("\\right")
                self.take(")")
            elif self.peek() == "(":
                inner, _ = self.group("(", ")")
            else:
                raise _Refuse  # \sin x, \sin^2 x: left to latex2sympy
            v = getattr(sp, _FUNCS[t])(inner)
            return v, not v.free_symbols
        raise _Refuse


def fast_parse(text: str):
    """The sympy value of ``text`` when it is in the subset above, else ``None``."""
    if not text or len(text) > 400:
        return None
    r = _Reader(text)
    try:
        v = r.expr("")
    except (_Refuse, RecursionError):
        return None
    except (TypeError, ValueError, ZeroDivisionError, AttributeError):
        return None
    if r.peek() != "":
        return None
    return v
