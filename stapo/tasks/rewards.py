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
through :func:`stapo.tasks.grading.grade` (worker processes; a worker stuck past its deadline is killed), so it is safe
inside TRL's reward plumbing, Snakemake ``run:`` blocks or any thread pool — and it grades exactly as the evaluation
does.
"""

from __future__ import annotations

from stapo.tasks.answers import last_boxed, normalize_answer, strict_box
from stapo.tasks.grading import grade

__all__ = ["dapo_strict", "dapo_lenient", "math_verify", "REWARDS"]

DAPO_TAIL_CHARS = 300  # verl math_dapo: "The longest answer in MATH-500 has 159 characters"
DAPO_BOX_WINDOW = 100  # JustRL is_correct_strict_box: the box is searched in the last 100 of those characters


def _completion_text(completion) -> str:
    """TRL passes strings (standard format) or a list of messages (conversational format)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


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

    Grading is :func:`stapo.tasks.grading.grade` — the evaluator's own: LaTeX-only parsing (no eval of model text),
    killable worker processes with a hard per-answer deadline, callable from any thread.
    """
    if answer is None:
        raise ValueError("math_verify: the dataset has no 'answer' column")
    grades = grade([_completion_text(c) for c in completions], [str(a) for a in answer], timeout=timeout_s)
    return [correct if g.correct else incorrect for g in grades]


def math_verify_01(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """math-verify reward with 1 / 0 values."""
    return math_verify(prompts, completions, answer, correct=1.0, incorrect=0.0, **kwargs)


REWARDS = {"dapo_strict": dapo_strict, "dapo_lenient": dapo_lenient, "math_verify": math_verify,
           "math_verify_01": math_verify_01}

