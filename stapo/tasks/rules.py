"""The rule stages of grading: one completion against one gold answer, in this process (stapo.tasks.grading runs
them in a pool of worker processes, under a deadline and a memory limit).

:func:`grade_one` returns a :class:`Grade` with two verdicts (three with a JustRL gold):

* **strict** (``Grade.correct`` with ``strict=True``; what ``stapo eval`` reports): the answer is the content of
  the final ``\\boxed{...}`` / ``\\fbox{...}`` of the whole completion (nested braces;
  ``stapo.tasks.answers.final_box``). No box, an unclosed final box (truncated mid-answer) or a box longer than
  ``MAX_BOX_CHARS`` is wrong (status ``no_box`` / ``unparsable``): the paper's prompt asks for a box, and leniency
  here favours runs whose entropy runs away (a rambling completion always contains some number).
* **justrl** (``Grade.justrl_correct``, given a JustRL gold; the rule verdict of ``eval.protocol: justrl``): JustRL's
  ``grade_answer_verl`` (stapo.tasks.justrl_grading) on the last ``\\boxed{}`` against JustRL's gold string, with
  the same deadline as the others (in its own SIGALRM window, after them).
* **fallback** (``Grade.fallback_correct``; a diagnostic, and the ``math_verify`` training reward's verdict): the
  final box if there is one, else math-verify's own LaTeX extraction from the completion's last
  ``MAX_COMPLETION_CHARS`` characters, else the last plain number of that tail ("... = 19.").

math-verify (LaTeX extraction only) parses prediction and gold and checks symbolic equivalence, after both are
put in one notation (``stapo.tasks.answers.normalize_notation``: e-notation, percent signs). Model output is text,
never code: we never eval/exec/sympify it, and math-verify's ``ExprExtractionConfig`` (which calls
``sympy.parse_expr``, an ``eval``) is deliberately not used. One SIGALRM deadline covers the whole answer (parse,
gold, verify; math-verify's own per-call alarms are off): these functions run in the main thread of a worker.
"""

from __future__ import annotations

import logging
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

from stapo.tasks import justrl_grading
from stapo.tasks.answers import (MAX_COMPLETION_CHARS, TOO_LONG, extract_answer, final_box, last_number,
                                 normalize_answer, normalize_notation)

__all__ = ["Grade", "grade_one", "MAX_INT_DIGITS"]

# Integers are compared exactly up to this many digits (Python's default int<->str limit is 4,300: a gold of
# 10^10000 written out would not parse). Converting 10^5 digits costs ~0.3 s (3.11, quadratic); longer integers
# stay unparsable (wrong, status "unparsable" or "ok" with a string comparison), bounded by the deadline.
MAX_INT_DIGITS = 100_000


@dataclass(frozen=True)
class Grade:
    """Verdict for one completion.

    correct:   the verdict of the policy ``grade`` was asked for (strict: the final box equals the gold).
    extracted: the answer text graded by that policy (the final box content, or the fallback's match), or None.
    status:    "ok" (graded), "no_box" (strict: no final box), "timeout" (killed at the deadline), "unparsable"
               (no answer found / not parsable / box too long), "error" (the worker crashed, e.g. out of memory).
    fallback_correct, fallback_extracted: the lenient fallback's verdict and answer (a diagnostic; equal to the
               strict ones whenever the completion has a final box).
    justrl_correct, justrl_status: JustRL's rule verdict (stapo.tasks.justrl_grading) against the JustRL gold, and its
               status ("ok", "no_box": no closed last ``\\boxed{}``, "timeout", "error"); None when ``grade`` was
               not given JustRL golds.
    """

    correct: bool
    extracted: str | None
    status: str
    fallback_correct: bool = False
    fallback_extracted: str | None = None
    justrl_correct: bool | None = None
    justrl_status: str | None = None


_TOO_LONG_MARK = "\x00too-long"  # answers.TOO_LONG as sent to a worker (a picklable string no completion contains)


def _parse_latex(text: str):
    from math_verify import LatexExtractionConfig, parse

    return parse(text, extraction_config=[LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=None)


@lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    """Gold answers repeat N times per problem (avg@N): parse each once per worker."""
    return _parse_latex(f"${gold}$")


class _Timeout(BaseException):
    """Raised at an answer's deadline; a BaseException, like math-verify's own, so its ``except Exception``
    passes it."""


@contextmanager
def _deadline(seconds: float):
    """SIGALRM after ``seconds`` of wall clock raises :class:`_Timeout` (main thread only)."""

    def expire(signum, frame):
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _OwnTimeouts(logging.Filter):
    """math-verify warns that its timeouts are off: ours (``_deadline``) replace them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.grader", "math_verify.parser"):
    logging.getLogger(_name).addFilter(_OwnTimeouts())


def grade_one(completion: str, gold: str, timeout: float = 5.0, strict: bool = False,
              justrl_gold: str | None = None) -> Grade:
    """Grade one completion in THIS process, within ``timeout`` s (a SIGALRM deadline: call from a main thread).

    This is what a worker runs (on :func:`_parts`); ``grade`` adds the process pool and the hard deadline around it.
    """
    box, tail, justrl = _parts(completion, justrl_gold)
    return _choose({**_grade_parts(box, tail, str(gold), timeout), **_grade_justrl(justrl, timeout)}, strict)


def _parts(completion: str, justrl_gold: str | None = None) -> tuple:
    """(final box or None / TOO_LONG marker string, the tail the fallback parses, the JustRL job: (its extracted
    answer, its gold) or None without a JustRL gold): all a worker needs."""
    box = final_box(completion)
    justrl = None if justrl_gold is None else (justrl_grading.extract_answer(completion), str(justrl_gold))
    return (_TOO_LONG_MARK if box is TOO_LONG else box), completion[-MAX_COMPLETION_CHARS:], justrl


def _choose(verdicts: dict, strict: bool) -> Grade:
    """The Grade of one policy from the worker's verdicts."""
    justrl = verdicts.get("justrl_correct"), verdicts.get("justrl_status")
    if strict:
        return Grade(verdicts["correct"], verdicts["extracted"], verdicts["status"], verdicts["fallback_correct"],
                     verdicts["fallback_extracted"], *justrl)
    return Grade(verdicts["fallback_correct"], verdicts["fallback_extracted"], verdicts["fallback_status"],
                 verdicts["fallback_correct"], verdicts["fallback_extracted"], *justrl)


@contextmanager
def _int_digits(limit: int):
    """Python's int/str conversion limit raised to ``limit`` digits while the block runs."""
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(previous)


def _grade_parts(box: str | None, tail: str, gold: str, timeout: float) -> dict:
    """Both verdicts for one completion; the fallback runs only when there is no usable final box."""
    too_long = box == _TOO_LONG_MARK
    try:
        with _deadline(timeout), _int_digits(MAX_INT_DIGITS):
            if box is not None and not too_long:
                ok, extracted, status = _verify(normalize_notation(box), gold, normalize=True)
                return dict(correct=ok, extracted=box, status=status, fallback_correct=ok,
                            fallback_extracted=box, fallback_status=status)
            ok, extracted, status = _fallback(tail, gold)
    except _Timeout:
        return _failed(box, tail, "timeout")
    strict_status = "unparsable" if too_long else "no_box"
    return dict(correct=False, extracted=None, status=strict_status, fallback_correct=ok, fallback_extracted=extracted,
                fallback_status=status)


def _grade_justrl(job: tuple[str | None, str] | None, timeout: float) -> dict:
    """JustRL's verdict on (its extracted answer, its gold), within its own ``timeout`` s; {} when not asked for.

    Python's default int/str digit limit is kept (JustRL ran without raising it).
    """
    if job is None:
        return {}
    answer, gold = job
    try:
        with _deadline(timeout):
            ok = justrl_grading.grade_extracted(answer, gold)
    except _Timeout:
        return dict(justrl_correct=False, justrl_status="timeout")
    except (MemoryError, Exception):  # the port catches what JustRL's bare excepts do; anything else is an error
        return dict(justrl_correct=False, justrl_status="error")
    return dict(justrl_correct=ok, justrl_status="ok" if answer is not None else "no_box")


def _verify(answer: str, gold: str, normalize: bool) -> tuple[bool, str, str]:
    """(correct, answer, status) of one extracted answer against the gold (math-verify, else string match)."""
    from math_verify import verify

    pred = _parse_latex(f"${answer}$")
    gold_parsed = _parse_gold(normalize_notation(gold) if normalize else gold)
    if not pred or not gold_parsed:
        # Not parsable as LaTeX (e.g. "\text{Evelyn}" vs a name): the normalised string match decides.
        if normalize_answer(answer) == normalize_answer(gold):
            return True, answer, "ok"
        return False, answer, "unparsable"
    return bool(verify(gold_parsed, pred, timeout_seconds=None)), answer, "ok"


def _fallback(tail: str, gold: str) -> tuple[bool, str | None, str]:
    """The lenient diagnostic for a completion without a final box: math-verify's LaTeX match, else the last number."""
    pred = _parse_latex(tail)
    if pred:
        extracted = str(pred[-1])
    else:
        # Plain-text answers ("... = 19."): the last number, found by a regex and parsed as LaTeX (still no eval).
        extracted = last_number(tail)
        if extracted is None:
            return False, None, "unparsable"
        return _verify(extracted, gold, normalize=False)
    from math_verify import verify

    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return normalize_answer(extracted) == normalize_answer(gold), extracted, "unparsable"
    return bool(verify(gold_parsed, pred, timeout_seconds=None)), extracted, "ok"


def _failed(box: str | None, tail: str, status: str, justrl=None) -> dict:
    """Verdicts of a completion whose grading failed (worker error, or killed past its deadline); with its JustRL
    job (``justrl``), that verdict fails too (the parent killed the worker, whichever stage hung)."""
    head = None if box is None or box == _TOO_LONG_MARK else box
    failed = dict(correct=False, extracted=head, status=status, fallback_correct=False,
                  fallback_extracted=head if head is not None else extract_answer(tail), fallback_status=status)
    return failed if justrl is None else {**failed, "justrl_correct": False, "justrl_status": status}
