"""Rule-based rewards for RL on math: the paper's DAPO verifier and a math-verify alternative.

    dapo_strict   the paper's reward, exactly as JustRL's ``math_dapo.compute_score`` (strict-box mode): of the
                  completion's last 300 characters it searches only the LAST 100; the answer is the content of
                  the last ``\\boxed{`` (brace-matched; ``\\fbox``, ``\\boxed 5`` and an unclosed box are no
                  answer); it must equal the gold answer string EXACTLY — no normalisation at all, so
                  ``{ 18 }``, ``18.``, ``$18$``, ``1,000`` and ``30^\\circ`` score −1 against 18 / 1000 / 30.
                  +1 correct, −1 otherwise. (DAPO's gold answers are integer strings.)
    dapo_lenient  the same box in the last 300 characters with light normalisation (``normalize_answer``) and
                  ``\\fbox`` / ``\\boxed 5`` accepted: a looser variant, not the paper's.
    math_verify   math-verify's symbolic equivalence of the last boxed (or otherwise parsed) answer; +1 / −1 by
                  default, or 1 / 0 (``incorrect=0.0``).

Both are TRL reward functions: ``f(prompts, completions, answer, **kwargs) -> list[float]``, where ``answer`` is the
dataset column with the gold answers (TRL passes every extra dataset column as a keyword list).

Grading timeouts use SIGALRM, which only works in the main thread of a process. ``math_verify`` therefore grades
through :func:`stapo.grading.grade` (worker processes; a worker stuck past its deadline is killed), so it is safe inside
TRL's reward plumbing, Snakemake ``run:`` blocks or any thread pool — and it grades exactly as the evaluation does.
"""

from __future__ import annotations

import re

__all__ = ["last_boxed", "normalize_answer", "dapo_strict", "dapo_lenient", "math_verify", "REWARDS", "get_reward"]

DAPO_TAIL_CHARS = 300  # verl math_dapo: "The longest answer in MATH-500 has 159 characters"
DAPO_BOX_WINDOW = 100  # JustRL is_correct_strict_box: the box is searched in the last 100 of those characters
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


def _completion_text(completion) -> str:
    """TRL passes strings (standard format) or a list of messages (conversational format)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def strict_box(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (brace-matched), or None: JustRL's ``last_boxed_only_string`` +
    ``remove_boxed`` (no ``\\fbox``, no space form; an unclosed last box is no answer)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    return _braced(text, start + len("\\boxed"))


def dapo_strict_score(completion: str, gold: str) -> float:
    """JustRL ``compute_score(strict_box_verify=True)``: +1 iff the last box in the last 100 of the last 300
    characters equals ``gold`` exactly, else −1."""
    pred = strict_box(completion[-DAPO_TAIL_CHARS:][-DAPO_BOX_WINDOW:])
    return 1.0 if pred == str(gold) else -1.0


def dapo_lenient_score(completion: str, gold: str) -> float:
    """+1 if the last box in the last 300 characters matches ``gold`` after normalisation, else −1."""
    boxed = last_boxed(completion[-DAPO_TAIL_CHARS:])
    if boxed is None:
        return -1.0
    return 1.0 if normalize_answer(boxed) == normalize_answer(str(gold)) else -1.0


def _scored(score, name):
    def reward(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
        if answer is None:
            raise ValueError(f"{name}: the dataset has no 'answer' column")
        return [score(_completion_text(c), a) for c, a in zip(completions, answer)]

    reward.__name__ = name
    return reward


# TRL reward-function signature; ``answer`` is the gold-answer column
dapo_strict = _scored(dapo_strict_score, "dapo_strict")
dapo_lenient = _scored(dapo_lenient_score, "dapo_lenient")


# ------------------------------------------------------------------------------------------- math-verify


def math_verify(prompts=None, completions=None, answer=None, *, correct: float = 1.0, incorrect: float = -1.0,
                timeout_s: float = 5.0, **kwargs) -> list[float]:
    """math-verify reward: ``correct`` / ``incorrect`` per completion (timeouts and unparsable answers: incorrect).

    Grading is :func:`stapo.grading.grade` — the evaluator's own: LaTeX-only parsing (no eval of model text),
    killable worker processes with a hard per-answer deadline, callable from any thread.
    """
    from stapo.grading import grade  # grading imports last_boxed from here

    if answer is None:
        raise ValueError("math_verify: the dataset has no 'answer' column")
    grades = grade([_completion_text(c) for c in completions], [str(a) for a in answer], timeout=timeout_s)
    return [correct if g.correct else incorrect for g in grades]


def math_verify_01(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """math-verify reward with 1 / 0 values."""
    return math_verify(prompts, completions, answer, correct=1.0, incorrect=0.0, **kwargs)


REWARDS = {"dapo_strict": dapo_strict, "dapo_lenient": dapo_lenient, "math_verify": math_verify,
           "math_verify_01": math_verify_01}


def get_reward(name: str):
    """The reward function registered as ``name`` (recipe key ``train.reward``), named for TRL's logs."""
    if name not in REWARDS:
        raise ValueError(f"train.reward: unknown reward {name!r}; expected one of {sorted(REWARDS)}")
    return REWARDS[name]
