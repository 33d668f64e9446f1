"""stapo.tasks.justrl_grading (``eval.protocol: justrl``'s rule stage) against JustRL's own verdicts, and its golds.

JustRL's grader is not importable offline, so benchmarks/bench_justrl_agreement.py grades a corpus with both
(the shipped benchmarks' answers written 27 ways models write them, 34,408 pairs; 0 disagreements, 2026-12-05, sympy
1.14.0, pylatexenc 2.10) and writes a stratified sample with JustRL's verdicts (tests/data/justrl_verdicts.jsonl)
and the sha256 of JustRL's gold strings (tests/data/justrl_golds.json), which these tests pin.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from stapo.tasks import justrl_grading as jg
from stapo.tasks.grading import grade
from stapo.tasks.rules import grade_one

DATA = Path(__file__).parent / "data"
BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")


def _pinned() -> list[dict]:
    return [json.loads(line) for line in (DATA / "justrl_verdicts.jsonl").read_text(encoding="utf-8").splitlines()]


def test_verdicts_equal_justrls_on_the_pinned_corpus():
    rows = _pinned()
    forms = Counter(r["form"] for r in rows)
    assert len(forms) == 27 and sum(forms.values()) == len(rows) >= 400
    assert {r["justrl"] for r in rows} == {True, False}
    wrong = [(r["form"], r["id"], r["completion"][-60:], r["gold"]) for r in rows
             if jg.grade_answer_verl(r["completion"], r["gold"]) is not r["justrl"]]
    assert wrong == []


def test_golds_are_justrls_byte_for_byte():
    """``answer_justrl`` of every shipped row equals JustRL's ``reward_model.ground_truth.strip()`` (pinned as a
    sha256 per benchmark): 1,546 rows."""
    from stapo.tasks import load_rows

    pinned = json.loads((DATA / "justrl_golds.json").read_text())
    total = 0
    for benchmark in BENCHMARKS:
        golds = [r["answer_justrl"] for r in load_rows(benchmark)]
        assert len(golds) == pinned[benchmark]["rows"], benchmark
        assert hashlib.sha256("\x00".join(golds).encode()).hexdigest() == pinned[benchmark]["sha256"], benchmark
        total += len(golds)
    assert total == 1546
    aime = load_rows("aime24")[0]
    assert (aime["answer"], aime["answer_justrl"]) == ("204", "\\boxed{204}")  # JustRL passes AIME24's golds boxed


@pytest.mark.parametrize("completion, gold, verdict", [
    ("so \\boxed{\\text{204}}", "204", True),  # the harness's strict grade rejects it
    ("\\boxed{204}", "\\boxed{204}", True),  # a boxed gold is unboxed first
    ("\\boxed{12 \\text{ cm}}", "12", True),  # mathd drops units after "\text{ "
    ("\\boxed{30^\\circ}", "30", True),
    ("\\boxed{50\\%}", "50", True),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{x=3}", "3", True),  # "k = " prefixes of at most two characters
    ("\\boxed{\\dfrac{1}{2}}", "0.5", True),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),  # sympy
    ("\\boxed{(1, 2]}", "(1,2]", True),
    ("\\boxed{(1, 2)}", "(1,2]", False),  # an interval's brackets must match
    ("\\boxed{4/8}", "\\frac{1}{2}", False),  # unreduced fractions are not simplified
    ("\\boxed{204.5}", "204", False),
    ("\\boxed{1} then \\boxed{2}", "1", False),  # the last box is the answer
    ("\\fbox{5}", "5", False),  # found, but not \boxed{...}
    ("\\boxed 5", "5", False),
    ("\\boxed{5", "5", False),  # truncated
    ("the answer is 5", "5", False),
    ("\\boxed{5}", "", False),
])
def test_known_verdicts(completion, gold, verdict):
    assert jg.grade_answer_verl(completion, gold) is verdict
    g = grade_one(completion, "unused", justrl_gold=gold)
    assert g.justrl_correct is verdict


def test_last_box_semantics():
    assert jg.last_boxed_only_string("a \\boxed{x{y}} b \\boxed{z}") == "\\boxed{z}"
    assert jg.last_boxed_only_string("\\fbox{3}") == "\\fbox{3}" and jg.extract_answer("\\fbox{3}") is None
    assert jg.last_boxed_only_string("\\boxed}{1}}") is None  # a stray "}" counts, as in JustRL's loop
    assert jg.extract_answer("\\boxed{1}" + "x" * 100_000) == "1"


def test_pool_grades_both_stages_in_one_pass():
    """Where the stages differ (from the corpus): JustRL unwraps ``\\text{}`` whole and ignores ``\\fbox``; the
    harness reads ``\\fbox`` and parses the LaTeX inside ``\\text{}``."""
    completions = ["so \\boxed{\\text{(a+5)(b+2)}}", "\\fbox{(a+5)(b+2)}", "\\boxed{(a+5)(b+3)}", "no box: (a+5)(b+2)"]
    gold = "(a+5)(b+2)"
    grades = grade(completions, [gold] * 4, strict=True, justrl_golds=[gold] * 4)
    assert [g.correct for g in grades] == [False, True, False, False]  # harness: strict final box, math-verify
    assert [g.justrl_correct for g in grades] == [True, False, False, False]
    assert [g.justrl_status for g in grades] == ["ok", "no_box", "ok", "no_box"]
    assert all(g.justrl_correct is None for g in grade(completions, [gold] * 4, strict=True))
    with pytest.raises(ValueError, match="JustRL golds"):
        grade(completions, [gold] * 4, justrl_golds=[gold])


def test_adversarial_sympy_input_is_bounded():
    """JustRL's guard lets ``**`` through (it checks ``^`` only): sympy would compute 9**9**99; the worker's
    deadline (or its memory limit) ends it and the batch goes on."""
    completions = ["\\boxed{9**9**99}", "\\boxed{(9**9)**(9**9)}", "\\boxed{7}"]
    start = time.monotonic()
    grades = grade(completions, ["7"] * 3, strict=True, timeout=2.0, justrl_golds=["7.5"] * 2 + ["7"])
    assert time.monotonic() - start < 20
    assert [g.justrl_correct for g in grades] == [False, False, True]
    assert grades[2].justrl_status == "ok" and grades[0].justrl_status in ("timeout", "error", "ok")
