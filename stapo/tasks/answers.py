"""Answer extraction from model completions: the boxed answer, the last plain number, one notation.

A leaf module (standard library only): the rewards (``stapo.tasks.rewards``) and the grader (``stapo.tasks.grading``)
both take their answers from here. Nothing here evaluates model text: extraction is brace matching and regular
expressions.

    last_boxed         the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 5`` (verl/MATH semantics)
    strict_box         the last ``\\boxed{...}`` only (JustRL's strict-box reward)
    final_box          the final box of a whole completion, bounded by ``MAX_BOX_CHARS`` (the strict grade)
    extract_answer     the last box in the completion's last ``MAX_COMPLETION_CHARS`` characters
    last_number        the last plain number ("... = 19.")
    normalize_answer   light normalisation before an exact string match
    normalize_notation e-notation and percent signs in one notation before math-verify parses an answer
"""

from __future__ import annotations

import re

__all__ = ["last_boxed", "strict_box", "final_box", "extract_answer", "last_number", "normalize_answer",
           "normalize_notation", "TOO_LONG", "MAX_COMPLETION_CHARS", "MAX_BOX_CHARS"]

MAX_COMPLETION_CHARS = 4096  # the grader's fallback parses only this tail of a completion
MAX_BOX_CHARS = 1024  # a longer final box is not an answer (MATH-500's longest gold has 159 characters)
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _braced(text: str, open_at: int) -> str | None:
    """Content of the brace group opening at ``text[open_at] == '{'`` (nested braces), or None if unclosed."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed ...`` in ``text``, or None.

    Nested braces are matched (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``); the space form ``\\boxed 5`` takes
    the characters up to the next ``$`` or whitespace (verl/MATH ``last_boxed_only_string`` semantics). An
    unclosed last box gives None.
    """
    if not text:
        return None
    starts = [(text.rfind(cmd), cmd) for cmd in _BOX_COMMANDS]
    start, cmd = max(starts)
    if start < 0:
        return None
    rest = start + len(cmd)
    if text.startswith(" ", rest) and not text[rest:].lstrip(" ").startswith("{"):
        match = re.match(r" +([^\s$]+)", text[rest:])
        return match.group(1) if match else None
    brace = rest + (len(text[rest:]) - len(text[rest:].lstrip(" ")))
    if brace >= len(text) or text[brace] != "{":
        return None
    return _braced(text, brace)


def strict_box(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (brace-matched), or None: JustRL's ``last_boxed_only_string`` +
    ``remove_boxed`` (no ``\\fbox``, no space form; an unclosed last box is no answer)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    return _braced(text, start + len("\\boxed"))


TOO_LONG = object()  # final_box: the final box exceeds MAX_BOX_CHARS


def final_box(completion: str):
    """Content of the final ``\\boxed{}``/``\\fbox{}`` anywhere in ``completion``; None, or ``TOO_LONG``.

    O(len) at C speed (``rfind``) plus at most ``MAX_BOX_CHARS`` of brace matching, so a 1 MB completion is cheap.
    """
    start = max(completion.rfind("\\boxed"), completion.rfind("\\fbox"))
    if start < 0:
        return None
    window = completion[start : start + MAX_BOX_CHARS + 16]  # the command, spaces, braces and the content
    content = last_boxed(window)
    if content is None and len(completion) > start + len(window):
        return TOO_LONG  # unclosed within the window: longer than any answer
    if content is not None and len(content) > MAX_BOX_CHARS:
        return TOO_LONG
    return content


def extract_answer(completion: str) -> str | None:
    """The last ``\\boxed{...}`` content in the bounded tail of ``completion`` (None if there is no box)."""
    return last_boxed(completion[-MAX_COMPLETION_CHARS:])


_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def last_number(text: str) -> str | None:
    """The last number in ``text`` (integers, decimals, a/b, thousands separators dropped), or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def normalize_answer(answer: str) -> str:
    """Light normalisation before the exact string match (DAPO verifier spirit, not symbolic).

    Strips surrounding whitespace and ``$``, ``\\left``/``\\right``, ``\\text{}``-style wrappers, ``\\!``/``\\,``
    spacing, all spaces, a trailing period, ``dfrac``/``tfrac`` -> ``frac``, and thousands separators in plain
    integers ("1,000" -> "1000").
    """
    s = answer.strip().strip("$").strip()
    s = _TEXT_WRAPPERS.sub(r"\1", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\dfrac", "\\frac"),
                     ("\\tfrac", "\\frac"), ("^\\circ", ""), ("^{\\circ}", "")):
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s).rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", s):
        s = s.replace(",", "")
    return s


_E_NOTATION = re.compile(r"(?<![\\\w.])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
_PERCENT = re.compile(r"(?:\\[ ,;!]|\s)*\\?%\s*$")


def normalize_notation(answer: str) -> str:
    """Same notation for prediction and gold: ``4.5e33`` -> ``4.5\\times10^{33}``; a trailing ``\\%`` is dropped.

    Computer e-notation becomes ``\\times10^{k}`` (Minerva's golds say ``4.5e33``; math-verify would read ``e`` as
    Euler's number) and a percent sign is dropped (``12\\%`` vs gold ``12``), as an LLM verifier would judge them.
    Units in ``\\text{}`` / ``\\mathrm{}`` are ignored by math-verify itself (``7.5\\times10^{5}\\text{ m/s}``
    equals ``7.5e5``).
    """
    answer = _E_NOTATION.sub(lambda m: f"{m.group(1)}\\times10^{{{int(m.group(2))}}}", answer)
    return _PERCENT.sub("", answer)
