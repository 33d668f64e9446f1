"""stapo.tasks.answers: box extraction (verl/MATH and JustRL semantics), the last plain number, normalisation."""

from __future__ import annotations

import pytest

from stapo.tasks.answers import MAX_BOX_CHARS, TOO_LONG, final_box, last_boxed, last_number, normalize_answer, \
    normalize_notation, strict_box


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\left\{ 1, \{2\} \right\}}", r"\left\{ 1, \{2\} \right\}"),
        (r"$\boxed 7$ done", "7"),
        (r"\fbox{x+1}", "x+1"),
        (r"\boxed{3} and later \fbox{4}", "4"),
        (r"\boxed {5}", "5"),
        (r"\boxed{unclosed", None),
        ("no box here", None),
        ("", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "raw, norm",
    [(" $42$ ", "42"), (r"\text{42}", "42"), (r"\dfrac{1}{2}", r"\frac{1}{2}"), ("1,000", "1000"), ("12.", "12"),
     (r"\left( 1, 2 \right)", "(1,2)"), ("3, 4", "3,4")],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_strict_box_takes_only_a_braced_boxed():
    assert strict_box(r"\boxed{1} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert strict_box(r"\boxed{1} then \fbox{2}") == "1" and strict_box(r"$\boxed 7$") is None
    assert strict_box(r"\boxed{1} then \boxed{2") is None  # the last box is unclosed


def test_final_box_is_bounded():
    assert final_box("no box") is None and final_box(r"\boxed{42}" + "x" * 10_000) == "42"
    assert final_box(r"\boxed{" + "1" * (MAX_BOX_CHARS + 1) + "}") is TOO_LONG
    assert final_box(r"\boxed{" + "1" * 10_000) is TOO_LONG  # unclosed past the window: longer than any answer
    assert final_box(r"\boxed{12") is None  # unclosed at the end: truncated mid-answer


def test_last_number():
    assert last_number("12 + 7 = 19.") == "19" and last_number("so 1,250.5 or -3/4") == "-3/4"
    assert last_number("no digits") is None


def test_notation_normalisation():
    assert normalize_notation("4.5e33") == "4.5\\times10^{33}"
    assert normalize_notation("2.3E-4") == "2.3\\times10^{-4}"
    assert normalize_notation("12\\%") == "12" and normalize_notation("12 \\%") == "12"
    assert normalize_notation("e^{2x}") == "e^{2x}" and normalize_notation("x2e3") == "x2e3"  # not numbers
