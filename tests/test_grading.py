"""stapo.tasks.rules and stapo.tasks.grading: verdicts on real benchmark golds, adversarial completions, the worker
pool."""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path

import pytest

from stapo.tasks.answers import MAX_BOX_CHARS, MAX_COMPLETION_CHARS, extract_answer, final_box
from stapo.tasks.grading import grade
from stapo.tasks.rules import Grade, grade_one

S = "We compute carefully. The final answer is "

# (boxed answer in the completion, gold answer, expected verdict); golds verbatim from the bundled benchmark files
# (stapo/tasks/data/*.jsonl), plus a few made-up ones for notations the files lack (intervals, names, e-notation, %)
CASES = [
    # integers (AIME / AMC golds)
    ("204", "204", True), ("204.0", "204", True), ("0204", "204", True), ("205", "204", False),
    ("113", "113", True), ("\\$113", "113", True), ("27", "27", True), ("-27", "27", False),
    ("70", "70", True), ("7", "70", False), ("36", "36", True), ("3.6", "36", False),
    # fractions / decimals / \dfrac vs \frac
    ("\\dfrac{14}{3}", "\\frac{14}{3}", True), ("14/3", "\\frac{14}{3}", True),
    ("\\frac{28}{6}", "\\frac{14}{3}", True), ("4.67", "\\frac{14}{3}", False),
    ("\\frac{3}{56}", "\\frac{3}{56}", True), ("\\tfrac{3}{56}", "\\frac{3}{56}", True),
    ("\\frac{56}{3}", "\\frac{3}{56}", False), ("1.25", "1.25", True), ("\\frac{5}{4}", "1.25", True),
    ("\\frac54", "1.25", True), ("1.2", "1.25", False), ("0.15", "0.15", True), ("\\frac{3}{20}", "0.15", True),
    ("0.150", "0.15", True), ("\\frac{3}{2}", "\\frac{3}{2}", True), ("1.5", "\\frac{3}{2}", True),
    ("\\frac{2}{3}", "\\frac{3}{2}", False), ("\\frac{243}{625}", "\\frac{243}{625}", True),
    ("0.3888", "\\frac{243}{625}", True), ("\\frac{35}{64}", "\\frac{35}{64}", True),
    ("\\frac{35}{63}", "\\frac{35}{64}", False),
    # radicals, pi
    ("3\\sqrt{13}", "3\\sqrt{13}", True), ("\\sqrt{117}", "3\\sqrt{13}", True), ("3\\sqrt{12}", "3\\sqrt{13}", False),
    ("\\sqrt{51}", "\\sqrt{51}", True), ("11\\sqrt{2}", "11\\sqrt2", True), ("\\sqrt{242}", "11\\sqrt2", True),
    ("70\\sqrt{2}", "70 \\sqrt{2}", True), ("\\frac{3\\sqrt3}{4}", "\\frac{3\\sqrt{3}}{4}", True),
    ("\\pi", "\\pi", True), ("3.14", "\\pi", False), ("-\\frac{\\pi}{6}", "-\\frac{\\pi}{6}", True),
    ("\\frac{\\pi}{6}", "-\\frac{\\pi}{6}", False),
    # degrees
    ("90^\\circ", "90^\\circ", True), ("90", "90^\\circ", True), ("90^{\\circ}", "90^\\circ", True),
    ("45^\\circ", "90^\\circ", False),
    # tuples / points / intervals
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("(3, \\pi)", "\\left( 3, \\frac{\\pi}{2} \\right)", False),
    ("(6,31,-1)", "(6,31,-1)", True), ("(6,-1,31)", "(6,31,-1)", False), ("(-2,1)", "(-2,1)", True),
    ("(-2, 1)", "(-2,1)", True), ("(1,-2)", "(-2,1)", False), ("[-2,1]", "[-2,1]", True), ("(-2,1]", "[-2,1]", False),
    # multiple answers
    ("1,-2", "1,-2", True), ("-2, 1", "1,-2", True), ("1", "1,-2", False), ("3, 5, 7", "3, 5, 7", True),
    ("69,84", "69,84", True), ("84,69", "69,84", True), ("69", "69,84", False),
    # text answers
    ("\\text{Evelyn}", "\\text{Evelyn}", True), ("\\text{Evelyn}", "\\text{Bob}", False),
    # symbolic (olympiadbench)
    ("\\frac{1}{2n+2}", "\\frac{1}{2 n+2}", True), ("\\frac{1}{2(n+1)}", "\\frac{1}{2 n+2}", True),
    ("\\frac{1}{2n}", "\\frac{1}{2 n+2}", False), ("f(x)=2x", "f(x)=2 x", True), ("f(x)=x", "f(x)=2 x", False),
    ("\\frac{n(n+1)(2n+1)}{6}", "\\frac{n(n+1)(2 n+1)}{6}", True),
    # minerva: decimals, scientific notation, units
    ("1.6", "1.6", True), ("1.6 \\text{ cm}", "1.6", True), ("41.8", "41.8", True), ("42.8", "41.8", False),
    ("0.006", "0.006", True), ("6 \\times 10^{-3}", "0.006", True),
    # units and computer e-notation (Minerva golds such as 4.5e33), percentages: as an LLM verifier judges them
    ("7.5\\times10^{5}\\text{ m/s}", "7.5e5", True), ("7.5 \\times 10^5 \\mathrm{~m} / \\mathrm{s}", "7.5e5", True),
    ("750000", "7.5e5", True), ("7.6\\times10^{5}\\text{ m/s}", "7.5e5", False), ("4.5\\times10^{33}", "4.5e33", True),
    ("4.5\\times10^{32}", "4.5e33", False), ("2.3 \\times 10^{-4}", "2.3e-4", True), ("0.00023", "2.3e-4", True),
    ("12\\%", "12", True), ("12\\ \\%", "12", True), ("12", "12\\%", True), ("12\\%", "12\\%", True),
    ("13\\%", "12", False), ("0.12", "12\\%", False),
]


def _completion(answer: str) -> str:
    return f"{S}$\\boxed{{{answer}}}$."


def test_case_table_verdicts():
    """All cases in one pooled call (the way stapo eval grades); every verdict must match the table."""
    grades = grade([_completion(a) for a, _, _ in CASES], [g for _, g, _ in CASES], timeout=10, strict=True)
    wrong = [(a, g, ok, r) for (a, g, ok), r in zip(CASES, grades) if r.correct != ok]
    assert not wrong, "\n".join(f"boxed {a!r} vs gold {g!r}: expected {ok}, got {r}" for a, g, ok, r in wrong)
    assert all(r.extracted == a for (a, _, _), r in zip(CASES, grades))


def test_grade_one_matches_pool_on_a_sample():
    for a, g, ok in CASES[::9]:
        assert grade_one(_completion(a), g).correct == ok


def test_extraction_last_box_nested_braces_and_no_box():
    assert extract_answer("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_answer("no box here") is None
    r = grade(["The answer is $\\frac{1}{2}$ I think"], ["\\frac12"])[0]  # math-verify's own LaTeX extraction
    assert r.correct and r.status == "ok"
    r = grade(["I do not know"], ["5"])[0]
    assert r == Grade(False, None, "unparsable")


def test_long_completion_is_bounded():
    text = "blah " * 400_000 + "\\boxed{42}"  # 2 MB
    t = time.monotonic()
    r = grade([text], ["42"])[0]
    assert r.correct and r.status == "ok" and time.monotonic() - t < 15
    # a box that lies before the bounded tail is not seen
    assert extract_answer("\\boxed{42}" + "x" * (MAX_COMPLETION_CHARS + 10)) is None


def test_length_mismatch_and_empty():
    with pytest.raises(ValueError, match="2 completions but 1 golds"):
        grade(["a", "b"], ["c"])
    assert grade([], []) == []


PWNED = Path("/tmp/pwned")

ADVERSARIAL = [
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{" + "{" * 500 + "1" + "}" * 500 + "}",
    "\\boxed{__import__('os').system('touch /tmp/pwned')}",
    "__import__('os').system('touch /tmp/pwned')",
    "The answer is $__import__('os').system('touch /tmp/pwned')$",
    "\\boxed{" + "1+" * 20_000 + "1}",
    "x" * 1_000_000 + "\\boxed{7}",
]


@pytest.mark.timeout(120)
def test_adversarial_bounded_nothing_executed_status_reported():
    PWNED.unlink(missing_ok=True)
    timeout, workers = 2.0, 2
    t = time.monotonic()
    grades = grade(ADVERSARIAL, ["1", "1", "0", "0", "0", "20001", "7"], timeout=timeout, workers=workers)
    elapsed = time.monotonic() - t
    assert elapsed < len(ADVERSARIAL) * timeout / workers + 10
    assert not PWNED.exists(), "a completion was executed"
    assert all(g.status in ("ok", "timeout", "unparsable", "error") for g in grades)
    assert grades[0].status in ("timeout", "error") and not grades[0].correct  # killed, batch continued
    assert grades[2].extracted == "__import__('os').system('touch /tmp/pwned')" and not grades[2].correct
    assert grades[-1].correct  # the 1 MB completion still grades


@pytest.mark.timeout(120)
def test_stuck_worker_is_replaced_and_batch_continues():
    hard = "\\boxed{9^{9^{9^{9}}}}"
    comps = [hard, _completion("1"), hard, _completion("2"), _completion("3")]
    grades = grade(comps, ["1", "1", "1", "2", "4"], timeout=1.5, workers=1)
    assert [g.status for g in grades] == ["timeout", "ok", "timeout", "ok", "ok"]
    assert [g.correct for g in grades] == [False, True, False, True, False]


# A real Minerva gold and a wrong answer whose sympy comparison runs for minutes in Python code (benchmark pair).
SLOW_GOLD = "m l \\ddot{\\theta}(t)-m g \\sin \\theta(t)=f(t) \\cos \\theta(t)"


@pytest.mark.timeout(120)
def test_slow_python_answer_times_out_in_the_worker_which_is_kept():
    from stapo.tasks import grading

    t = time.monotonic()
    g = grade_one(f"\\boxed{{{SLOW_GOLD}+1}}", SLOW_GOLD, timeout=1.0)
    assert g.status == "timeout" and not g.correct and g.extracted == SLOW_GOLD + "+1"
    assert time.monotonic() - t < 3  # the comparison alone runs for minutes
    grade([_completion("1")], ["1"], workers=1)
    pid = grading._POOL[0].proc.pid
    grades = grade([_completion(SLOW_GOLD + "+1"), _completion("2")], [SLOW_GOLD, "2"], timeout=1.0, workers=1)
    assert [g.status for g in grades] == ["timeout", "ok"] and grades[1].correct
    assert grading._POOL[0].proc.pid == pid  # stopped by its own deadline, not killed: warm caches kept


def test_answers_to_one_gold_queue_for_one_worker_and_idle_workers_take_from_the_longest_queue():
    from stapo.tasks.grading import _gold_queues, _next_job

    golds = ["1", "2", "1", "3", "\\frac{1}{2}", "2", "1"] * 3
    queues = _gold_queues(golds, 3)
    assert sorted(i for q in queues for i in q) == list(range(len(golds)))
    for gold in set(golds):
        assert sum(any(golds[i] == gold for i in q) for q in queues) == 1  # parsed by one worker only
    assert all(list(q) == sorted(q) for q in queues)
    queues = [deque([0, 1]), deque(), deque([2, 3, 4])]
    assert [_next_job(queues, 0), _next_job(queues, 1), _next_job(queues, 1), _next_job(queues, 2)] == [0, 4, 3, 2]
    assert _next_job(queues, 2) == 1 and _next_job(queues, 0) is None


def test_grade_from_a_non_main_thread():
    out = []
    th = threading.Thread(target=lambda: out.append(grade([_completion("\\dfrac{1}{2}")], ["0.5"], timeout=5)))
    th.start()
    th.join(60)
    assert out and out[0][0].correct


def test_no_signal_handler_left_in_parent():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    grade([_completion("1")], ["1"])
    assert signal.getsignal(signal.SIGALRM) == before


def test_workers_persist_between_calls_and_dead_ones_are_replaced():
    from stapo.tasks import grading

    grade([_completion("1")] * 2, ["1"] * 2, workers=2)
    pids = {w.proc.pid for w in grading._POOL[:2]}
    assert grade([_completion("2")] * 2, ["2"] * 2, workers=2)[0].correct
    assert {w.proc.pid for w in grading._POOL[:2]} == pids
    grading._POOL[0].proc.kill()
    grading._POOL[0].proc.join(5)
    assert all(g.correct for g in grade([_completion("3")] * 2, ["3"] * 2, workers=2))


def test_task_process_results_hook_for_plain_lm_eval():
    from stapo.tasks.registry import process_results

    assert process_results({"answer": "2"}, [_completion("2"), "no answer"]) == {"acc": 0.5}


def test_plain_text_answer_falls_back_to_the_last_number():
    g = grade_one("12 + 7 = 19.", "19")
    assert g.correct and g.extracted == "19" and g.status == "ok"
    assert not grade_one("The answer is 20", "19").correct


# ------------------------------------------------------------------------------------ strict (reported) verdicts


def test_strict_grades_only_the_final_box_and_keeps_the_fallback_as_a_diagnostic():
    texts = ["...maybe the total is 204 hmm", "so $x = 204$ I guess", "First \\boxed{204}, no wait, \\boxed{205}",
             "The answer is \\boxed{204}", "truncated mid-answer: \\boxed{20"]
    strict = grade(texts, ["204"] * 5, strict=True)
    assert [g.correct for g in strict] == [False, False, False, True, False]
    assert [g.status for g in strict] == ["no_box", "no_box", "ok", "ok", "no_box"]
    assert [g.extracted for g in strict] == [None, None, "205", "204", None]
    # the lenient fallback (last LaTeX expression, then the last number) is kept, under its own name
    assert [g.fallback_correct for g in strict] == [True, True, False, True, False]
    lenient = grade(texts, ["204"] * 5)  # the default policy: math_verify training reward, unchanged
    assert [g.correct for g in lenient] == [True, True, False, True, False]
    assert grade_one(texts[0], "204", strict=True).correct is False


def test_strict_box_is_found_anywhere_and_an_overlong_box_is_not_graded_from_its_tail():
    late = "\\boxed{42}" + " and then some more words" * 400  # the box lies before the fallback's 4 KB tail
    assert len(late) > MAX_COMPLETION_CHARS + 1000
    g = grade([late], ["42"], strict=True)[0]
    assert g.correct and g.extracted == "42"
    huge = "\\boxed{" + "1+" * 3000 + "42}"  # 6 KB box: the old grader parsed its last 4 KB ("...1+1+42")
    assert final_box(huge) is not None and len(huge) > MAX_BOX_CHARS
    g = grade([huge], ["42"], strict=True)[0]
    assert (g.correct, g.status) == (False, "unparsable")
    g = grade(["\\boxed{" + "x" * (MAX_BOX_CHARS + 50) + "} = 42"], ["42"], strict=True)[0]
    assert not g.correct and g.status == "unparsable"


def test_identical_pairs_are_graded_once_and_fanned_out_in_order():
    from stapo.tasks.grading import _unique_jobs

    same_box = ["Adding gives $\\boxed{204}$.", "Another route, same end: \\boxed{204}", "\\boxed{205}"]
    no_box = ["... so the total is 204", "... so the total is 205"]
    texts = same_box + no_box + [same_box[0]]
    golds = ["204"] * 5 + ["205"]
    parts, unique_golds, first_of = _unique_jobs(texts, golds)
    # one job per (final box, gold); without a box the fallback's tail is part of the key
    assert first_of == [0, 0, 1, 2, 3, 4] and unique_golds == ["204", "204", "204", "204", "205"]
    assert parts[0] == ("204", same_box[0], None) and parts[2] == (None, no_box[0], None)
    graded = grade(texts, golds, strict=True)
    assert [g.correct for g in graded] == [True, True, False, False, False, False]
    assert [g.fallback_correct for g in graded] == [True, True, False, True, False, False]
    assert graded[0] == graded[1] and graded[0].extracted == "204"


def test_huge_integers_are_compared_exactly():
    """A gold written out with 10,001 digits (over Python's 4,300-digit int/str limit) against a power of ten."""
    import sys

    from stapo.tasks.rules import MAX_INT_DIGITS

    gold = "1" + "0" * 10_000
    limit = sys.get_int_max_str_digits()
    completions = [f"{S}\\boxed{{10^{{10000}}}}", f"{S}\\boxed{{10^{{9999}}}}", f"{S}\\boxed{{10^{{10001}}}}"]
    grades = grade(completions, [gold] * 3, strict=True)
    assert [g.correct for g in grades] == [True, False, False] and {g.status for g in grades} == {"ok"}
    assert grade_one(completions[0], gold, strict=True).correct  # in this process too
    assert sys.get_int_max_str_digits() == limit  # raised only while grading
    # past the bound: explicit, never an exception or a hang
    start = time.monotonic()
    (g,) = grade([f"{S}\\boxed{{10^{{{MAX_INT_DIGITS * 2}}}}}"], ["1" + "0" * (MAX_INT_DIGITS * 2)], strict=True)
    assert not g.correct and g.status in ("ok", "unparsable", "timeout") and time.monotonic() - start < 15
